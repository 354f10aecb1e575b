#pragma once
/// \file hdf5_store.hpp
/// A SampleStore over HDF5 token shards (docs/dataset.md): samples read by a
/// BatchReader, with the next optimizer step's samples read ahead while this one
/// computes.

#include <cstdint>
#include <deque>
#include <vector>

#include "data/dataset/batch_reader.hpp"
#include "data/dataset/token_dataset.hpp"
#include "data/sample_store.hpp"

namespace dst::data {

/// Serves read(ids) from a BatchReader. Without prefetch() every read is a request and
/// a wait. With prefetching (BatchSource::read_ahead promises the next step's samples as
/// soon as one step's are handed out) the reads of step k+1 overlap the forward/backward
/// of step k, and the data phase only copies.
class Hdf5SampleStore final : public SampleStore {
 public:
  Hdf5SampleStore(const TokenDataset& dataset, BatchReaderOptions options);
  ~Hdf5SampleStore() override;

  std::uint64_t num_samples() const override { return dataset_.num_samples(); }
  /// out: (ids.size(), seq_len + 1). Throws DatasetError from the reader, and dst::Error
  /// when `ids` are not the next promised ones (a caller's bug: reads follow promises).
  void read(const std::vector<std::uint64_t>& ids, std::int32_t* out) override;
  /// Requests `ids` from the reader now.
  void prefetch(const std::vector<std::uint64_t>& ids) override;

  const TokenDataset& dataset() const { return dataset_; }
  BatchReaderStats stats() const { return reader_.stats(); }

 private:
  TokenDataset dataset_;
  BatchReader reader_;
  std::deque<std::vector<std::uint64_t>> pending_;  // requests outstanding in reader_
};

/// The first samples' tokens of `dataset` as one stream (at most `max_tokens`, rounded
/// down to whole samples), read through a BatchReader: for statistics such as the
/// bigram baseline. Serial (no prefetch); call it on one rank.
std::vector<std::int32_t> read_token_stream(const TokenDataset& dataset, std::uint64_t max_tokens);

}  // namespace dst::data
