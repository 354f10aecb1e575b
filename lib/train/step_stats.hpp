#pragma once
/// \file step_stats.hpp
/// What one optimizer step did, as the trainer reports it to the metrics log.

#include <cstdint>
#include <vector>

namespace dst::train {

/// One MoE block's load balance over a step's global batch (DeepSeekMoE models).
struct MoeBalance {
  double max_over_mean = 0.0;             ///< busiest expert's tokens / the mean over experts
  double busiest_fraction = 0.0;          ///< fraction of the batch's tokens the busiest expert got
  std::int64_t idle_experts = 0;          ///< experts that got no token this step
  double bias_min = 0.0, bias_max = 0.0;  ///< the correction bias's range after the step
};

/// What one optimizer step did (identical on every rank).
struct StepStats {
  std::int64_t step = 0;
  double loss = 0.0;        ///< mean over every target token of the global batch
  std::int64_t tokens = 0;  ///< target tokens in the global batch (ignored excluded)
  double grad_norm = 0.0;   ///< of the mean-loss gradient, before clipping
  double lr = 0.0;
  bool skipped = false;     ///< non-finite gradients and debug.nan_policy = skip, or fp16 overflow
  bool overflow = false;    ///< fp16: the gradients overflowed (skipped, the loss scale halved)
  double loss_scale = 0.0;  ///< fp16: the loss scale this step's backward used; 0 otherwise
  int stop_ranks = 0;       ///< ranks that had received a stop signal (runtime/signals.hpp)
  double seconds = 0.0;     ///< wall time of the step
  /// DeepSeekMoE: the sequence-wise balance loss, mean over the global batch's sequences,
  /// summed over the MoE blocks (not part of `loss`), and each MoE block's balance. Empty
  /// and 0 for a dense model.
  double aux_loss = 0.0;
  std::vector<MoeBalance> moe;
  /// model.moe.capacity_factor > 0: `moe_capacity` true, the (token, slot) rows the experts'
  /// capacity dropped over the global batch and the MoE blocks, and their fraction of the
  /// rows routed (tokens x top-k x MoE blocks).
  bool moe_capacity = false;
  double moe_dropped = 0.0, moe_dropped_fraction = 0.0;
  /// Multi-token prediction (model.mtp_depth 1): `mtp` true and `mtp_loss` the MTP module's
  /// loss, mean over the global batch's valid t+2 targets (not part of `loss`; the
  /// gradient is that of loss + model.mtp_loss_weight x mtp_loss).
  bool mtp = false;
  double mtp_loss = 0.0;
  // phase timers (this rank, seconds)
  double t_data = 0.0, t_forward = 0.0, t_backward = 0.0, t_comm = 0.0, t_optimizer = 0.0;
  /// Expert parallelism (parallel.expert > 1; all 0 otherwise): this rank's time in the MoE
  /// layers' all-to-alls (part of t_forward and t_backward), the bytes it sent and received
  /// in them, and the (token, slot) rows the experts of each data rank computed, highest
  /// and mean over the data group (summed over the MoE blocks and micro-batches).
  double t_alltoall = 0.0;
  double alltoall_bytes = 0.0;
  double expert_rows_max = 0.0, expert_rows_mean = 0.0;
  /// Tensor parallelism (parallel.tensor > 1; 0 otherwise): this rank's time in the layers'
  /// all-reduces over the tensor group (part of t_forward and t_backward), and the bytes
  /// they reduced.
  double t_tensor = 0.0;
  double tensor_bytes = 0.0;
};

}  // namespace dst::train
