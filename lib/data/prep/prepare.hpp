#pragma once
/// \file prepare.hpp
/// `dstrain prep`: text or JSON Lines corpora -> tokenized shards (docs/dataset.md,
/// "Preparing a dataset"), in parallel over the ranks of an MPI communicator.
///
/// Every rank scans every input (finding document boundaries is cheap) so that all ranks
/// number the documents alike. Document i goes to the validation split when
/// ValidSplit::held_out(i); the j-th document of a split is tokenized and written by
/// rank j mod R. Rank r writes its own shards
/// `<name>-<split>-<r>-<k>.h5` (5-digit r and k), closing one when it reaches the target
/// size; rank 0 finally writes `<name>-train.manifest` (and `<name>-valid.manifest`)
/// listing all shards in (rank, k) order. For any rank count the dataset holds the same
/// documents and the same split; only their order in the token stream depends on R
/// (training permutes samples anyway).
///
/// Failure: a rank that meets a bad input stops, and at the next synchronisation point
/// (every few thousand documents or megabytes, identical on all ranks because they scan
/// the same bytes) every rank learns of it. Each rank removes the shards it wrote, no
/// manifest is written, and every rank throws the same CollectiveError carrying the
/// first failing rank's message, so it is printed once. Shards are written under a
/// `.tmp` name and renamed when complete (ShardWriter), so even a killed prep leaves no
/// incomplete file named `*.h5`, and no manifest.

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/dataset/shard_format.hpp"
#include "data/prep/document_reader.hpp"
#include "data/tokenizer/tokenizer.hpp"

namespace dst::data {

/// Which documents are held out: document i (0-based, in input order) is in the
/// validation split when floor((i+1) * num / den) > floor(i * num / den), i.e. a fraction
/// num/den of the documents, evenly spread; num = 1, den = N holds out every N-th.
/// Integer arithmetic, so every rank and every run decides alike.
struct ValidSplit {
  std::uint64_t num = 0;
  std::uint64_t den = 1;
  bool held_out(std::uint64_t index) const {
    return num > 0 && ((index + 1) * num) / den > (index * num) / den;
  }
};

struct PrepOptions {
  std::vector<std::string> inputs;  ///< files, directories, "-" (see expand_inputs)
  InputOptions input;
  std::string out_dir;
  std::string name = "data";  ///< file name prefix of shards and manifests
  /// A shard is closed once its /tokens reaches this many bytes. 64 MiB: large enough
  /// that a 100 GB corpus is ~1600 files, small enough that ranks finish together.
  double shard_mb = 64.0;
  ValidSplit valid;
  bool overwrite = false;  ///< replace an existing dataset of the same name in out_dir
  /// Deadline of each synchronisation: how long a rank may wait for the slowest one to
  /// finish the documents between two synchronisation points.
  double timeout_s = 600.0;
  /// Synchronise (error agreement, progress) after this many documents or input bytes,
  /// whichever comes first: often enough for a live progress bar, rarely enough that
  /// the collectives cost nothing next to tokenizing (~2 per MB at worst).
  std::uint64_t sync_documents = 4096;
  std::uint64_t sync_bytes = std::uint64_t{4} << 20;
  std::uint64_t chunk_tokens = std::uint64_t{1} << 18;  ///< ShardWriterOptions::chunk_tokens
};

/// The tokenizer and what the shards record about it.
struct PrepTokenizer {
  const Tokenizer* tokenizer = nullptr;
  TokenizerIdentity identity;
  std::uint64_t vocab_size = 0;
  std::uint64_t eos_id = 0;
};

/// Totals over all ranks; index 0 = train, 1 = validation.
struct PrepCounts {
  std::uint64_t documents[2] = {0, 0};
  std::uint64_t tokens[2] = {0, 0};  ///< EOS included, as stored
  std::uint64_t shards[2] = {0, 0};
};

/// What rank 0 knows at a synchronisation point.
struct PrepProgress {
  std::uint64_t bytes_scanned = 0;
  std::uint64_t total_bytes = 0;  ///< 0 when unknown (standard input)
  PrepCounts counts;
  double seconds = 0.0;
};

struct PrepSummary {
  PrepCounts counts;
  std::uint64_t input_bytes = 0;
  double seconds = 0.0;  ///< wall time, inputs to manifest
  int ranks = 1;
  std::string train_manifest;
  std::string valid_manifest;  ///< empty when no document was held out
};

/// The identity recorded in shards written with the byte-level tokenizer (vocab 260).
TokenizerIdentity byte_tokenizer_identity();

/// Runs the preparation; collective over `comm`. `progress` is called on rank 0 at each
/// synchronisation point. Throws CollectiveError (the same on every rank, exit code
/// kExitError) for bad inputs, an output folder that already holds the dataset (without
/// `overwrite`), a failed write, or no training document; TimeoutError when a rank
/// misses a synchronisation deadline.
PrepSummary prepare_dataset(MPI_Comm comm, const PrepTokenizer& tokenizer,
                            const PrepOptions& options,
                            const std::function<void(const PrepProgress&)>& progress = {});

}  // namespace dst::data
