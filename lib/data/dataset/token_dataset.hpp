#pragma once
/// \file token_dataset.hpp
/// A training dataset: the concatenation of one or more token shards, cut into samples.
///
/// Sample i is tokens [i*T, i*T + T + 1) of the concatenated token stream of all shards
/// (T = seq_len): the model's inputs are its first T tokens and its targets the last T.
/// Consecutive samples share one token, samples cross document boundaries (documents are
/// separated by EOS in the stream) and shard boundaries. There are
/// floor((num_tokens - 1) / T) samples; the tokens after the last full sample are unused.

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "config/run_config.hpp"
#include "data/dataset/shard_format.hpp"

namespace dst::data {

/// The shards of a dataset and where each starts in the token stream. Plain data, the
/// same on every rank; opens no file (BatchReader does).
class TokenDataset {
 public:
  TokenDataset() = default;
  /// From checked, agreeing headers (open_dataset builds it; tests may too).
  TokenDataset(std::vector<ShardHeader> shards, int seq_len);

  const std::vector<ShardHeader>& shards() const { return shards_; }
  /// Where shard s starts in the concatenated stream; shard_start(num shards) is the
  /// total. (num_shards + 1,)
  std::uint64_t shard_start(std::size_t s) const { return starts_.at(s); }
  std::uint64_t num_tokens() const { return starts_.back(); }
  std::uint64_t num_samples() const { return num_samples_; }
  int seq_len() const { return seq_len_; }
  std::uint64_t vocab_size() const { return shards_.front().vocab_size; }
  std::uint64_t eos_id() const { return shards_.front().eos_id; }
  const TokenizerIdentity& tokenizer() const { return shards_.front().tokenizer; }

 private:
  std::vector<ShardHeader> shards_;
  std::vector<std::uint64_t> starts_{0};
  std::uint64_t num_samples_ = 0;
  int seq_len_ = 0;
};

/// The shard files a dataset source names, in stream order:
/// - a path containing '*', '?' or '[': a glob, matches sorted by name (byte order);
/// - a directory: its `*.h5` files, sorted by name;
/// - a path ending in ".h5": that one shard;
/// - anything else: a manifest (by convention `*.manifest`; the deck's data.format auto
///   reads `*.txt` as a text corpus), a text file with one shard path per line (relative
///   paths are relative to the manifest's folder; blank lines and lines starting with '#'
///   are skipped), in the listed order.
/// Glob and directory matches that do not end in ".h5" (among them the `.h5.tmp` of a
/// shard being written) are skipped; a manifest or path naming a `.tmp` is an error.
/// Throws DatasetError when nothing matches or the manifest cannot be read.
std::vector<std::string> resolve_shard_paths(const std::string& source);

/// Opens the dataset `source` (see resolve_shard_paths) for samples of seq_len tokens.
/// Collective over `comm`: rank 0 resolves the source, checks every shard's header
/// (ShardCheck::header) and that the shards agree (check_shards_agree), then broadcasts
/// the result, so a dataset of many shards costs one metadata read per shard, not one
/// per rank. An error found by rank 0 is thrown as the same DatasetError on every rank
/// (no rank is left waiting). Throws when the dataset holds no full sample. The other
/// ranks wait for rank 0's result at most `timeout_s` (the deck's parallel.timeout_s;
/// by default that key's default), then throw TimeoutError naming the dataset.
TokenDataset open_dataset(MPI_Comm comm, const std::string& source, int seq_len,
                          double timeout_s = config::ParallelSection{}.timeout_s);

}  // namespace dst::data
