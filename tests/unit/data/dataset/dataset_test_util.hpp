#pragma once
/// \file dataset_test_util.hpp
/// Shared by the dataset unit and MPI tests: a deterministic corpus whose token stream
/// the tests know independently of any reader, shards written from it, scratch folders.

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "data/byte_vocab.hpp"
#include "data/dataset/shard_writer.hpp"

namespace dst::data::test {

/// Document d of the corpus: 1 + (37 d mod 23) byte tokens, token j = (131 d + 17 j) mod
/// 256. Lengths vary from 1 to 23 so that samples of 16 tokens cross document ends.
inline std::vector<std::int32_t> corpus_document(std::uint64_t d) {
  const std::uint64_t len = 1 + (37 * d) % 23;
  std::vector<std::int32_t> doc(len);
  for (std::uint64_t j = 0; j < len; ++j)
    doc[j] = static_cast<std::int32_t>((131 * d + 17 * j) % 256);
  return doc;
}

inline ShardWriterOptions byte_options(std::uint64_t chunk_tokens = 64) {
  ShardWriterOptions o;
  o.vocab_size = kByteVocabSize;
  o.eos_id = kByteEos;
  o.tokenizer = {"byte260", definition_hash("byte260: ids 0..255 bytes, 256 bos, 257 eos")};
  o.chunk_tokens = chunk_tokens;
  return o;
}

/// Writes documents [first, first + count) of the corpus to `path` (a closed shard).
inline ShardHeader write_corpus_shard(const std::string& path, std::uint64_t first,
                                      std::uint64_t count,
                                      const ShardWriterOptions& options = byte_options()) {
  ShardWriter w(path, options);
  for (std::uint64_t d = first; d < first + count; ++d)
    w.append_document(corpus_document(d));
  return w.close();
}

/// The token stream of documents [first, first + count): each followed by EOS.
inline std::vector<std::int32_t> corpus_stream(std::uint64_t first, std::uint64_t count,
                                               std::int32_t eos = kByteEos) {
  std::vector<std::int32_t> s;
  for (std::uint64_t d = first; d < first + count; ++d) {
    const auto doc = corpus_document(d);
    s.insert(s.end(), doc.begin(), doc.end());
    s.push_back(eos);
  }
  return s;
}

/// A fresh folder under the system's temporary directory, removed on destruction.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag) {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("dst_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  /// Uses an existing folder name (e.g. broadcast from rank 0); `owner` removes it.
  ScratchDir(std::filesystem::path path, bool owner) : path_(std::move(path)), owner_(owner) {
    if (owner_) std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    if (owner_) std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
  bool owner_ = true;
};

}  // namespace dst::data::test
