#pragma once
/// \file text_store.hpp
/// A SampleStore over an in-memory byte-level token stream (data/text_corpus.hpp).

#include <vector>

#include "data/sample_store.hpp"
#include "data/text_corpus.hpp"

namespace dst::data {

class TextSampleStore final : public SampleStore {
 public:
  TextSampleStore(std::vector<std::int32_t> stream, std::int64_t seq_len)
      : stream_(std::move(stream)), seq_len_(seq_len) {}
  std::uint64_t num_samples() const override {
    return static_cast<std::uint64_t>(sample_count(stream_, seq_len_));
  }
  void read(const std::vector<std::uint64_t>& ids, std::int32_t* out) override {
    for (std::size_t i = 0; i < ids.size(); ++i)
      copy_sample(stream_, seq_len_, ids[i], out + i * static_cast<std::size_t>(seq_len_ + 1));
  }
  const std::vector<std::int32_t>& stream() const { return stream_; }

 private:
  std::vector<std::int32_t> stream_;
  std::int64_t seq_len_;
};

}  // namespace dst::data
