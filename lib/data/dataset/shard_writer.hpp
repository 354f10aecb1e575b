#pragma once
/// \file shard_writer.hpp
/// Writes one token shard (docs/dataset.md) document by document.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset/detail/h5.hpp"
#include "data/dataset/shard_format.hpp"
#include "h5/handle.hpp"

namespace dst::data {

/// What a shard records about its tokens.
struct ShardWriterOptions {
  std::uint64_t vocab_size = 0;  ///< ids are in [0, vocab_size); picks uint16 or uint32
  std::uint64_t eos_id = 0;      ///< appended after every document
  TokenizerIdentity tokenizer;   ///< name and definition_hash() of the tokenizer
  /// Tokens per HDF5 chunk. 2^18 tokens = 512 KiB (uint16) / 1 MiB (uint32): the size of
  /// HDF5's default 1 MiB chunk cache, and large enough that appends write big blocks.
  /// Tests use small chunks so that reads cross chunk boundaries.
  std::uint64_t chunk_tokens = std::uint64_t{1} << 18;
};

/// Appends documents to `<path>.tmp` and publishes it as `<path>` on close() by renaming
/// (atomic within a file system, after an fsync), so a shard named `*.h5` is always
/// complete: an interrupted writer leaves only a `.tmp`, which readers never open.
/// Serial: one process writes one shard (with HDF5's default driver); preparation jobs
/// write different shards from different ranks.
///
///   ShardWriter w("data/train-00000.h5", {260, kByteEos, {"byte260", hash}});
///   w.append_document(ids);   // ids (n,), EOS is appended by the writer
///   w.close();                // -> data/train-00000.h5
class ShardWriter {
 public:
  /// Creates `<path>.tmp` (replacing any stale one). `path` must end in ".h5".
  /// Throws DatasetError on bad options or when the file cannot be created.
  ShardWriter(std::string path, ShardWriterOptions options);
  /// Without close(): discards the temporary file (an error is unwinding, or the caller
  /// gave up); `<path>` is not touched.
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  /// Appends one document, tokens (count,) each in [0, vocab_size), then eos_id.
  /// Throws DatasetError naming the document and position of an id out of range.
  void append_document(const std::int32_t* tokens, std::size_t count);
  void append_document(const std::vector<std::int32_t>& tokens) {
    append_document(tokens.data(), tokens.size());
  }

  /// Writes the attributes, closes and fsyncs the file, renames it to `path`, and
  /// returns the header it wrote. A second close() throws.
  ShardHeader close();

  std::uint64_t num_tokens() const { return num_tokens_; }
  std::uint64_t num_documents() const { return offsets_written_ + offsets_.size() - 1; }
  const std::string& path() const { return path_; }

 private:
  void flush_tokens();
  void flush_offsets(bool all);
  void append_to(hid_t dataset, std::uint64_t at, const void* data, std::uint64_t count,
                 hid_t mem_type);

  std::string path_;
  std::string tmp_path_;
  ShardWriterOptions options_;
  h5::Handle file_;
  h5::Handle tokens_;                     // (num_tokens,) uint16/uint32, extendible
  h5::Handle offsets_ds_;                 // (num_documents + 1,) uint64, extendible
  std::vector<std::uint32_t> token_buf_;  // (<= chunk_tokens,) not yet written
  std::vector<std::uint64_t> offsets_;    // offsets not yet written (front: the last written + 1)
  std::uint64_t num_tokens_ = 0;          // appended, written or buffered
  std::uint64_t tokens_written_ = 0;
  std::uint64_t offsets_written_ = 0;
  bool closed_ = false;
};

}  // namespace dst::data
