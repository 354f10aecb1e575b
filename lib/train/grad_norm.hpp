#pragma once
/// \file grad_norm.hpp
/// The gradient norm for clipping and the non-finite check, over a ParamStore's
/// gradients. The trainer all-reduces local_sum_of_squares() where gradients are sharded
/// (each rank holding part of them), takes the square root, and passes clip_factor(...)
/// to AdamW::step as part of grad_scale.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/communicator.hpp"
#include "model/param_store.hpp"
#include "tensor/context.hpp"

namespace dst::train {

class GradNorm {
 public:
  GradNorm() = default;
  GradNorm(const GradNorm&) = delete;
  GradNorm& operator=(const GradNorm&) = delete;
  ~GradNorm();

  /// Sums of squares of each gradient tensor (kernels::sum_of_squares_into, double), then
  /// their sum in store order: a fixed order, so equal gradients give equal bits on every
  /// rank. Returns that local total. The per-tensor sums land in one buffer in ctx's memory
  /// and come to the host in one copy: on a GPU, one stream synchronisation per step, not
  /// one per tensor. Storage is reused: no allocation after the first call (or after a
  /// change of back end or store size).
  double compute(const tensor::ExecContext& ctx, const model::ParamStore& store);

  /// The same total where every rank of `group` holds the same gradients (summed in
  /// shared memory), with the work shared: each rank sums the tensors whose middle
  /// element lies in its part of the flat buffer (comm::SharedSum::part_of), and one
  /// all-reduce of the per-tensor sums (every entry one rank's value, the others +0, so
  /// exact) gives every rank all of them, added in store order: compute()'s bits.
  /// Collective over `group`; host memory only.
  double compute_shared(const tensor::ExecContext& ctx, const model::ParamStore& store,
                        comm::Communicator& group);

  /// The same total under ZeRO with shards of whole tensors (ZeroShards::by_tensors):
  /// only the gradients of this rank's shard [first, last) hold the sums, so each rank
  /// sums the tensors that start there, and one all-reduce of the per-tensor sums (every
  /// entry one rank's value, the others +0, so exact) gives every rank all of them, added
  /// in store order: compute()'s bits. Collective over `group`. Throws dst::Error if a
  /// tensor starting in the shard does not end in it.
  double compute_sharded(const tensor::ExecContext& ctx, const model::ParamStore& store,
                         std::size_t first, std::size_t last, comm::Communicator& group);

  /// Per tensor, in store order (metrics: the norm of each tensor's gradient).
  const std::vector<double>& per_tensor() const { return per_tensor_; }
  double local_sum_of_squares() const { return total_; }

 private:
  void release();

  std::vector<double> per_tensor_;
  double total_ = 0.0;
  // The per-tensor sums in the back end's memory where that is not the host's.
  double* device_sums_ = nullptr;
  std::size_t device_count_ = 0;
  tensor::Device device_ = tensor::Device::host;
  void* stream_ = nullptr;
};

/// Where the first non-finite gradient value is: tensor index in store order and flat
/// element index within it, or {-1, -1} when every gradient is finite.
struct NonFinite {
  std::int64_t tensor = -1;
  std::int64_t element = -1;
  bool found() const { return tensor >= 0; }
};
/// Scans the gradient tensors in store order, stopping at the first with a NaN or Inf,
/// so the trainer can name it ("model.layers.3.mlp.up_proj.weight[1234]").
NonFinite first_nonfinite_grad(const tensor::ExecContext& ctx, const model::ParamStore& store);
/// The same over the tensors that start in the flat-buffer range [first, last) only (a
/// ZeRO shard of whole tensors, where the other gradients are not this rank's sums).
NonFinite first_nonfinite_grad(const tensor::ExecContext& ctx, const model::ParamStore& store,
                               std::size_t first, std::size_t last);

/// The factor clipping multiplies every gradient by: min(1, max_norm / (norm + 1e-6)),
/// as torch.nn.utils.clip_grad_norm_ (whose 1e-6 keeps a zero norm from dividing by 0);
/// 1 when max_norm is 0 (training.grad_clip = 0: no clipping). Throws dst::Error for a
/// negative or non-finite norm or max_norm (the caller handles non-finite gradients first).
double clip_factor(double norm, double max_norm);

}  // namespace dst::train
