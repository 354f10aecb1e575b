#pragma once
/// \file faults.hpp
/// The deck's fault injection (debug.inject_*), in one place: which rank each fault hits,
/// at which step, and what it does. The training run and the trainer ask this object at
/// the points where a fault can strike; nothing else reads the debug.inject_* keys
/// (debug.inject_read_delay_ms goes to the data reader's options from here too).
/// Every fault is for tests: docs/operations.md says what each one shows.

#include <cstddef>
#include <cstdint>
#include <optional>

#include "config/run_config.hpp"
#include "model/param_store.hpp"

namespace dst::train {

class Faults {
 public:
  /// The faults of `debug` as they apply to world rank `rank` of `world_size` ranks.
  Faults(const config::DebugSection& debug, int rank, int world_size);

  /// Before step `step` (counted from 1) of the run: debug.inject_exit_rank ends this
  /// process (exit code kExitInjected) and debug.inject_hang_rank makes it hang (alive,
  /// no progress), once this run has committed a checkpoint (`saved_this_run`), so that
  /// the tests can check that checkpoint stays intact.
  void before_step(std::int64_t step, bool saved_this_run) const;

  /// debug.inject_hang_alltoallv_rank: whether this rank hangs in the next step's first
  /// expert all-to-all-v (once this run has committed a checkpoint).
  bool hangs_in_alltoallv(bool saved_this_run) const {
    return saved_this_run && debug_.inject_hang_alltoallv_rank == rank_;
  }

  /// debug.inject_straggler_rank: this rank's data phase takes inject_straggler_ms longer.
  void straggle() const;

  /// debug.inject_nan_step / inject_overflow_step: the value the last rank writes into
  /// one of its own gradients during step `step` (counted from 0), NaN or +inf; nullopt
  /// when no gradient is poisoned.
  std::optional<float> gradient_poison(std::int64_t step) const;
  /// Where in `store` (its flat gradient buffer) the poison goes: the first gradient of
  /// the MLP output of `store`'s last block `last_block` (an MoE block's: of its first
  /// routed expert, the first of `first_expert` with expert parallelism's storage).
  static std::size_t poison_offset(const config::ModelSection& model,
                                   const model::ParamStore& store, std::int64_t last_block,
                                   std::int64_t first_expert);

  /// debug.inject_divergence_rank: this rank perturbs a parameter after step `step`
  /// (counted from 0), so that the cross-rank consistency check must catch it.
  bool diverges_after(std::int64_t step) const;

  /// debug.inject_exit_in_checkpoint: the rank that dies half-way through writing a
  /// checkpoint, once an earlier checkpoint exists (`have_checkpoint`); -1 for none.
  int checkpoint_exit_rank(bool have_checkpoint) const;

  /// debug.inject_read_delay_ms: how long the data reader sleeps before each read.
  int read_delay_ms() const { return static_cast<int>(debug_.inject_read_delay_ms); }

 private:
  config::DebugSection debug_;
  int rank_;
  int world_size_;
};

}  // namespace dst::train
