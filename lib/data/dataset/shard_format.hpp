#pragma once
/// \file shard_format.hpp
/// The token shard format (docs/dataset.md, format version 1): names, the header every
/// shard carries, and the checks a shard must pass before it is read.
///
/// A shard is one HDF5 file:
///   /tokens       (num_tokens,)      uint16 if vocab_size <= 65536, else uint32; chunked.
///                                    The documents back to back, each ended by eos_id.
///   /doc_offsets  (num_documents+1,) uint64: document d is tokens[off[d], off[d+1]);
///                                    off[0] = 0, strictly increasing, off[last] = num_tokens.
///   attributes of / : format = "dstrain.tokens", format_version, vocab_size, eos_id,
///                     tokenizer_name, tokenizer_hash, num_tokens, num_documents.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "data/dataset/dataset_error.hpp"

namespace dst::data {

inline constexpr std::uint32_t kShardFormatVersion = 1;
inline constexpr const char* kShardFormatName = "dstrain.tokens";  ///< value of `format`
inline constexpr const char* kShardSuffix = ".h5";      ///< a finished shard's file name ends so
inline constexpr const char* kShardTmpSuffix = ".tmp";  ///< appended while it is being written
inline constexpr const char* kTokensDataset = "tokens";
inline constexpr const char* kOffsetsDataset = "doc_offsets";
/// uint16 tokens hold ids 0..65535.
inline constexpr std::uint64_t kMaxVocabForUint16 = 65536;
/// Tokens are int32 in memory (the model's ids), so ids must stay below 2^31.
inline constexpr std::uint64_t kMaxVocabSize = 2147483647;

/// Which tokenizer produced the ids: its name and a hash of its full definition (e.g. of
/// tokenizer.json), so that two tokenizers with one name but different merges disagree.
struct TokenizerIdentity {
  std::string name;
  std::string hash;
  bool operator==(const TokenizerIdentity& o) const { return name == o.name && hash == o.hash; }
};

/// A shard's attributes and sizes, as read and checked by validate_shard.
struct ShardHeader {
  std::string path;
  std::uint32_t format_version = 0;
  std::uint64_t vocab_size = 0;
  std::uint64_t eos_id = 0;
  TokenizerIdentity tokenizer;
  std::uint64_t num_tokens = 0;
  std::uint64_t num_documents = 0;
  int token_bytes = 0;  ///< 2 (uint16) or 4 (uint32)
};

enum class ShardCheck {
  /// Attributes, datasets, dtypes and sizes agree: O(1) reads, done by open_dataset.
  header,
  /// header, plus doc_offsets monotone and within bounds, every token id below
  /// vocab_size, every document ended by eos_id: reads the whole shard.
  full,
};

/// Checks the structure of the shard at `path` (serially, HDF5's default driver) and
/// returns its header. Throws DatasetError "shard '<path>': <problem>" on the first
/// problem: missing file, a `.tmp` name, not HDF5, missing or mistyped attribute, missing
/// dataset, wrong dtype or rank, sizes that disagree with the attributes, and with
/// ShardCheck::full bad offsets or token ids. Never crashes on a well-formed HDF5 file with
/// hostile content (fuzz_shard); libhdf5's own parsing of a crafted file is not guarded
/// (known libhdf5 CVEs): only read shards you produced or trust (docs/fuzzing.md).
ShardHeader validate_shard(const std::string& path, ShardCheck level = ShardCheck::full);

/// Throws DatasetError naming the first shard that disagrees with shards[0] on format
/// version, vocabulary size, EOS id, tokenizer name or tokenizer hash, and both values.
void check_shards_agree(const std::vector<ShardHeader>& shards);

/// "fnv1a64:<16 hex digits>" of a tokenizer definition, for TokenizerIdentity::hash.
std::string definition_hash(std::string_view definition);

}  // namespace dst::data
