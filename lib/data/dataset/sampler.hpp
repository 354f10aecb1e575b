#pragma once
/// \file sampler.hpp
/// The deterministic order in which training consumes samples.
///
/// The global order of an epoch is a pure function of (seed, epoch): a random-access
/// permutation of [0, num_samples) (FeistelPermutation), so no rank ever materialises a
/// permutation (num_samples may be 2^40) and any rank can compute any position of it.
/// Each optimizer step consumes the next `global_batch_size` positions of that order;
/// data-parallel rank r takes the contiguous block r of the step's global batch and
/// splits it into micro-batches. Concatenating the ranks' blocks in rank order therefore
/// gives the same global batch whatever the number of ranks. The tail of an epoch that
/// does not fill a global batch is dropped (drop-last), and the next epoch is a new
/// permutation.
///
/// Reproducibility contract (part of the run format: changing any line changes the data
/// order of every run, so resume from an older checkpoint would see other samples):
///   tag        = core::hash_name("dst::data::sampler")
///   epoch key  = words 0, 1 of philox4x32({epoch lo, epoch hi, tag lo, tag hi},
///                                         {seed lo, seed hi})
///   domain     = 2^(2h), h = max(1, ceil(ceil(log2 n) / 2)); x = (L << h) | R
///   round r    = (L, R) -> (R, L ^ (w0 & (2^h - 1))),  w = philox4x32({R, 0, r, 0}, key),
///                r = 0 .. 5
///   image of x = the first value < n of encrypt(x), encrypt(encrypt(x)), ... (cycle walk)

#include <array>
#include <cstdint>
#include <vector>

namespace dst::data {

/// A keyed bijection of [0, n) evaluated one element at a time in O(1) memory: a balanced
/// Feistel network over the smallest even-bit power of two >= n, with Philox4x32-10 as
/// round function, restricted to [0, n) by cycle walking (the walk leaves the domain at
/// most 3 times in 4 on average because the power of two is < 4n).
class FeistelPermutation {
 public:
  /// n >= 1 elements; the permutation is keyed by (seed, epoch).
  FeistelPermutation(std::uint64_t n, std::uint64_t seed, std::uint64_t epoch);

  std::uint64_t size() const { return n_; }
  /// The image of x in [0, n); throws dst::Error when x >= n.
  std::uint64_t operator()(std::uint64_t x) const;
  /// The x with (*this)(x) == y; throws dst::Error when y >= n.
  std::uint64_t inverse(std::uint64_t y) const;

 private:
  std::uint64_t encrypt(std::uint64_t x) const;
  std::uint64_t decrypt(std::uint64_t y) const;
  std::uint32_t round_value(std::uint32_t round, std::uint64_t half) const;

  std::uint64_t n_;
  int half_bits_;
  std::uint64_t half_mask_;
  std::array<std::uint32_t, 2> key_;
};

/// Where training stands in the data: `consumed` samples of epoch `epoch` are used.
/// Saved in checkpoints; Sampler::seek to it continues exactly where the run stopped.
struct SamplePosition {
  std::uint64_t epoch = 0;
  std::uint64_t consumed = 0;
  bool operator==(const SamplePosition& o) const {
    return epoch == o.epoch && consumed == o.consumed;
  }
  bool operator!=(const SamplePosition& o) const { return !(*this == o); }
};

/// How the samples of one step are split.
struct SamplerConfig {
  std::uint64_t num_samples = 0;        ///< TokenDataset::num_samples()
  std::uint64_t seed = 0;               ///< the run's data seed
  std::uint64_t global_batch_size = 0;  ///< samples per optimizer step, all ranks together
  std::uint64_t micro_batch_size = 0;   ///< samples per forward/backward on one rank
  int dp_rank = 0;                      ///< this rank in the data-parallel group
  int dp_size = 1;                      ///< ranks in the data-parallel group
};

/// This rank's view of the global sample order, with a position that advances one
/// optimizer step at a time. Everything except next_step() is a pure function.
///
/// global_batch_size must be a multiple of dp_size * micro_batch_size, so that every
/// rank runs the same number of micro-batches (micro_batches_per_step()).
class Sampler {
 public:
  /// Throws dst::Error on an inconsistent configuration (sizes of zero, a global batch
  /// that does not split evenly, fewer samples than one global batch).
  explicit Sampler(const SamplerConfig& config);

  const SamplerConfig& config() const { return config_; }
  /// Full global batches per epoch: floor(num_samples / global_batch_size).
  std::uint64_t steps_per_epoch() const;
  /// global_batch_size / (dp_size * micro_batch_size).
  std::uint64_t micro_batches_per_step() const;

  /// The sample at position `index` of epoch `epoch`'s order (index < num_samples).
  std::uint64_t sample_at(std::uint64_t epoch, std::uint64_t index) const;
  /// The whole global batch that starts at `pos` (after normalisation, see seek):
  /// (global_batch_size,), rank r's block is [r * G / dp_size, (r + 1) * G / dp_size).
  std::vector<std::uint64_t> global_batch(SamplePosition pos) const;
  /// This rank's samples of the step that starts at `pos`:
  /// (micro_batches_per_step, micro_batch_size).
  std::vector<std::vector<std::uint64_t>> rank_step(SamplePosition pos) const;

  /// The position the next step starts from. Always normalised: consumed +
  /// global_batch_size <= num_samples (otherwise the epoch is over and it reads (e+1, 0)).
  SamplePosition position() const { return position_; }
  /// Continues from `pos` (e.g. read from a checkpoint). `consumed` need not be a
  /// multiple of the global batch (the batch size may have changed); a position past the
  /// last full batch of its epoch moves to the start of the next epoch. Throws dst::Error
  /// when consumed > num_samples.
  void seek(SamplePosition pos);
  /// This rank's samples of the next step, (micro_batches_per_step, micro_batch_size);
  /// advances the position by one global batch.
  std::vector<std::vector<std::uint64_t>> next_step();

 private:
  SamplePosition normalise(SamplePosition pos) const;

  SamplerConfig config_;
  SamplePosition position_;
};

}  // namespace dst::data
