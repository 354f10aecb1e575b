#pragma once
/// \file global_norm.hpp
/// The squared norm of the whole model's gradient from one rank's share of it. A rank
/// holds the summed gradients of some tensors (its stage's, its slices of them, its own
/// routed experts); the per-tensor sums of squares of those (GradNorm) become the whole
/// model's in the order a one-stage, one-slice run adds them, so every layout of the same
/// model gives the same double where the per-tensor sums agree:
///  - tensor slices: each split tensor's sum over its slices, a tensor every slice holds
///    whole counted once (tensor rank 0's), a slice shared by R ranks once (its first
///    holder's); one all-reduce over the tensor group;
///  - own experts (expert parallelism's storage): the replicated tensors once, each own
///    expert's sum from its holder over the expert group;
///  - pipeline stages: every stage's sums all-gathered and added in the whole model's
///    order (the interleaved schedule's chunks are not in it; the last stage's copy of the
///    embedding table is left out: stage 0's counts).

#include <cstddef>
#include <vector>

#include "comm/communicator.hpp"
#include "model/param_store.hpp"

namespace dst::train {

class GlobalNorm {
 public:
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  /// Where a rank's tensors stand in the whole model. Groups not in use are null; each
  /// must outlive the GlobalNorm.
  struct Parts {
    /// Tensor slices (parallel.tensor > 1): the tensor group and this rank's place in it.
    comm::Communicator* tensor = nullptr;
    int tensor_rank = 0;
    /// Own routed experts: the store's tensors from own_experts_from on, each held by one
    /// rank of the expert group.
    comm::Communicator* expert = nullptr;
    std::size_t own_experts_from = kNone;
    /// Pipeline stages: the pipeline group (its rank is the stage); each stage's tensor
    /// count in its whole layout (every expert, whole tensors); the stages' layouts in
    /// turn, each tensor's index in the whole model (kNone: counted elsewhere); with own
    /// experts, each tensor of this rank's store's index in its stage's layout.
    comm::Communicator* pipeline = nullptr;
    std::vector<std::size_t> stage_sizes;
    std::vector<std::size_t> model_index;
    std::vector<std::size_t> stage_index;
  };
  /// Throws dst::Error when the parts do not fit together (stages without their sizes or
  /// indices, own experts on stages without the store's indices, no expert group).
  explicit GlobalNorm(Parts parts);

  /// The whole model's squared gradient norm from this rank's per-tensor sums of squares
  /// `per_tensor` (one per tensor of `ps`, 0 for those whose sums it does not hold) and
  /// their total `local` (returned as it is when this rank holds the whole model).
  /// Collective over the groups in use; the same double on every rank.
  double sum_of_squares(const model::ParamStore& ps, std::vector<double> per_tensor,
                        double local) const;

 private:
  Parts parts_;
};

}  // namespace dst::train
