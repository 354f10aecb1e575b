#pragma once
/// \file moe_balancer.hpp
/// DeepSeekMoE's step-level bookkeeping: the expert loads and the sequence-wise balance
/// loss summed over the data group (so that every rank moves the correction biases alike:
/// auxiliary-loss-free balancing, model.moe.bias_update_rate), and the balance metrics of
/// every MoE block of the whole model (StepStats::moe, aux_loss, the capacity's dropped
/// rows), with a warning for an expert left idle for many steps.
///
/// With pipeline stages each stage holds some of the model's MoE blocks (the interleaved
/// schedule's chunks not in the model's order): the balance loss is summed over the stages
/// in a one-stage run's order, and the metrics cover every stage's blocks in the model's
/// order. The bias update itself stays the model's (Trainer::move_moe_bias).

#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/process_groups.hpp"
#include "config/run_config.hpp"
#include "train/step_stats.hpp"

namespace dst::train {

class MoeBalancer {
 public:
  /// The balancer of a rank of pipeline stage `groups.pipeline_rank` under `layout`;
  /// `groups` must outlive it.
  MoeBalancer(const config::RunConfig& config, const config::Layout& layout,
              comm::ProcessGroups& groups);

  /// Some stage holds an MoE block: every stage then takes part in reduce() and report().
  bool active() const { return active_; }
  /// This rank's MoE blocks (its stage's, over its chunks).
  std::size_t own_blocks() const { return stage_blocks_[static_cast<std::size_t>(stage_)]; }

  /// Pipeline stages: a training step of `micro_batches` starts (the terms of every
  /// micro-batch forget the previous step's).
  void begin_step(std::int64_t micro_batches);
  /// Pipeline stages: chunk `chunk`'s forward of micro-batch `micro` had these balance-loss
  /// terms, one per MoE block of the chunk (MicroBatchResult::aux_losses).
  void keep_terms(std::int64_t micro, int chunk, const std::vector<double>& terms);

  /// A step's loads summed over the data group.
  struct Sums {
    std::vector<double> loads;  ///< (this stage's MoE blocks x experts), block-major
    double dropped = 0.0;       ///< rows the experts' capacity dropped (this stage's blocks)
    double aux = 0.0;           ///< the whole model's balance loss, summed over sequences
  };
  /// This rank's `loads` (model::LanguageModel::moe_loads()), `dropped` and balance-loss sum
  /// `aux_sum` (one stage: summed over its micro-batches and blocks; with stages ignored:
  /// the whole model's is summed from keep_terms() over the stages, in a one-stage run's
  /// order) summed over the data group in one all-reduce. Collective over the data group
  /// and, with stages, the pipeline group.
  Sums reduce(std::vector<double> loads, double dropped, double aux_sum) const;

  /// Fills `st`'s aux_loss, moe, moe_capacity, moe_dropped and moe_dropped_fraction from
  /// `sums` and this stage's correction biases after the step (`bias`, block-major, as
  /// model::LanguageModel::moe_bias()); warns (rank 0) of an expert that crosses 100 steps in
  /// a row without a token (`step`: the step's index from 0). Collective over the pipeline
  /// group.
  void report(const Sums& sums, std::vector<float> bias, StepStats& st, std::int64_t step);

 private:
  comm::ProcessGroups& groups_;
  std::int64_t global_batch_, seq_len_, experts_, top_k_;
  bool capacity_;
  int stage_ = 0, stages_ = 1;
  bool active_ = false;
  /// Each stage's MoE blocks; every stage's MoE blocks in turn (each in its chunks'
  /// order): their index among the model's MoE blocks; this rank's MoE blocks before each
  /// of its chunks.
  std::vector<std::size_t> stage_blocks_, order_, chunk_offset_;
  /// (micro_batches_ x this stage's MoE blocks): keep_terms()'s.
  std::int64_t micro_batches_ = 0;
  std::vector<double> terms_;
  /// Per MoE block and expert, steps in a row without a token.
  std::vector<std::int64_t> idle_steps_;
};

}  // namespace dst::train
