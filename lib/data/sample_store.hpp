#pragma once
/// \file sample_store.hpp
/// Where a run's samples come from (SampleStore: text in memory, HDF5 shards), and the
/// one object that turns the training order into each step's batches (BatchSource: the
/// run's only sampler, which also tells the store what to read ahead).

#include <cstdint>
#include <vector>

#include "data/dataset/sampler.hpp"

namespace dst::data {

/// Fills `out` with seq_len + 1 tokens per sample id. A sample may end in padding:
/// model::kIgnoreIndex from some position to its end. Those targets are not scored (the
/// loss is the mean over the real targets of the whole global batch), and the padded
/// inputs are fed as token 0, whose outputs only ever predict padding.
class SampleStore {
 public:
  virtual ~SampleStore() = default;
  virtual std::uint64_t num_samples() const = 0;
  /// out: (ids.size(), seq_len + 1), host memory. Where prefetch() was called, the reads
  /// must come in the order of the prefetches, with the same ids.
  virtual void read(const std::vector<std::uint64_t>& ids, std::int32_t* out) = 0;
  /// A promise that read(ids) comes next, after the reads already promised: a store that
  /// reads ahead starts reading them now. The default reads nothing ahead.
  virtual void prefetch(const std::vector<std::uint64_t>& ids) { (void)ids; }
};

/// This rank's batches of the training order: owns the run's one Sampler, reads each
/// step's micro-batches from the store and, while read-ahead allows, promises the store
/// the next step's samples as soon as one step's are handed out (so an HDF5 store reads
/// step k+1 while step k computes).
class BatchSource {
 public:
  /// `store` must outlive this; `config.num_samples` is the store's. `seq_len`: tokens
  /// per sample (each row holds seq_len + 1).
  BatchSource(SampleStore& store, const SamplerConfig& config, std::int64_t seq_len);

  /// This rank's samples of the next step into `out`, (micro_batches, micro_batch_size,
  /// seq_len + 1); advances the sampler by one global batch.
  void next_step(std::int32_t* out);
  /// Reads ahead for at most `steps` more steps (0: none), starting with the next one:
  /// nothing is requested for steps that will not run, so no read is in flight at the end.
  void read_ahead(std::int64_t steps);
  /// Continues the order at `pos` (a checkpoint's). Only before read-ahead starts.
  void seek(SamplePosition pos);

  const Sampler& sampler() const { return sampler_; }

 private:
  void promise_next_step();
  SampleStore& store_;
  Sampler sampler_;
  std::int64_t seq_len_;
  std::int64_t ahead_left_ = 0;  ///< steps whose samples may still be promised
  bool promised_ = false;        ///< the next step's samples are promised to the store
};

}  // namespace dst::data
