#include "train/grad_norm.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.hpp"
#include "kernels/kernels.hpp"

namespace dst::train {

double GradNorm::compute(const tensor::ExecContext& ctx, const model::ParamStore& store) {
  per_tensor_.resize(store.size());
  total_ = 0.0;
  for (std::size_t i = 0; i < store.size(); ++i) {
    per_tensor_[i] = kernels::sum_of_squares(ctx, store.grad(i));
    total_ += per_tensor_[i];
  }
  return total_;
}

NonFinite first_nonfinite_grad(const tensor::ExecContext& ctx, const model::ParamStore& store) {
  for (std::size_t i = 0; i < store.size(); ++i) {
    const std::int64_t at = kernels::first_nonfinite(ctx, store.grad(i));
    if (at >= 0) return NonFinite{static_cast<std::int64_t>(i), at};
  }
  return NonFinite{};
}

double clip_factor(double norm, double max_norm) {
  // isfinite first: an ordered comparison with a NaN raises FE_INVALID.
  if (!std::isfinite(max_norm) || max_norm < 0.0)
    throw Error("train::clip_factor: max_norm (training.grad_clip) must be finite and >= 0, got " +
                std::to_string(max_norm));
  if (!std::isfinite(norm) || norm < 0.0)
    throw Error("train::clip_factor: the gradient norm must be finite and >= 0, got " +
                std::to_string(norm));
  if (max_norm == 0.0) return 1.0;
  // torch.nn.utils.clip_grad_norm_'s epsilon.
  return std::min(1.0, max_norm / (norm + 1e-6));
}

}  // namespace dst::train
