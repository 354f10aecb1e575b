#pragma once
/// \file train_data.hpp
/// A run's training and validation samples (data.train, data.valid): text files read
/// whole (byte-level, in memory) or HDF5 shards from `dstrain prep` read through a
/// BatchReader, with what the log and the checkpoints say about them.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "config/run_config.hpp"
#include "data/hdf5_store.hpp"
#include "data/sample_store.hpp"
#include "runtime/runtime.hpp"

namespace dst::train {

/// The bigram baseline reads every token on one rank: above this many (train + valid)
/// it is skipped, since 50 M int32 tokens are already 200 MB and seconds of reading.
inline constexpr std::uint64_t kBigramMaxTokens = 50'000'000;

struct TrainData {
  std::unique_ptr<data::SampleStore> train;  ///< the training samples
  std::unique_ptr<data::SampleStore> valid;  ///< the validation samples; possibly none
  std::uint64_t train_docs = 0, train_tokens = 0, valid_tokens = 0;
  std::string tokenizer_name;  ///< identity of the tokenizer the data was made with

  /// Opens data.train / data.valid on every rank (HDF5: collectively, rank 0 reading the
  /// headers; the training store reads ahead where MPI allows a reader thread). A problem
  /// (no files, a vocabulary larger than the model's, tokenizers that differ, fewer
  /// samples than one global batch of `layout`) is reported once and ends the job with
  /// the deck exit code. `read_delay_ms`: debug.inject_read_delay_ms (Faults).
  static TrainData open(runtime::Runtime& rt, const config::RunConfig& cfg,
                        const config::Layout& layout, int read_delay_ms);

  /// The bigram baseline's validation loss (on `root` only; nullopt elsewhere), or
  /// nullopt with a stated reason in `note` when HDF5 data is too large to count on one
  /// rank (kBigramMaxTokens) or has no validation set.
  std::optional<double> bigram_baseline(std::int64_t vocab_size, bool root,
                                        std::string& note) const;

 private:
  data::Hdf5SampleStore* train_h5_ = nullptr;  ///< HDF5 data: the stores' datasets
  data::Hdf5SampleStore* valid_h5_ = nullptr;
};

}  // namespace dst::train
