#include "train/grad_norm.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "comm/shared_sum.hpp"
#include "core/error.hpp"
#include "kernels/kernels.hpp"
#include "tensor/memory.hpp"

namespace dst::train {

GradNorm::~GradNorm() {
  release();
}

void GradNorm::release() {
  if (device_sums_) tensor::release(device_, device_sums_, stream_);
  device_sums_ = nullptr;
  device_count_ = 0;
}

double GradNorm::compute(const tensor::ExecContext& ctx, const model::ParamStore& store) {
  const std::size_t n = store.size();
  per_tensor_.resize(n);
  total_ = 0.0;
  if (n == 0) return total_;
  const tensor::Device device = tensor::device_of(ctx);
  double* sums = per_tensor_.data();
  if (device != tensor::Device::host) {
    if (!device_sums_ || device_count_ != n || device_ != device || stream_ != ctx.stream) {
      release();
      device_sums_ = static_cast<double*>(
          tensor::allocate(device, n * sizeof(double), ctx.stream, "gradient norm sums"));
      device_count_ = n;
      device_ = device;
      stream_ = ctx.stream;
    }
    sums = device_sums_;
  }
  tensor::Tensor out{sums, {static_cast<std::int64_t>(n)}, DType::f64};
  out.device = device;
  for (std::size_t i = 0; i < n; ++i)
    kernels::sum_of_squares_into(ctx, store.grad(i), out, static_cast<std::int64_t>(i));
  if (device != tensor::Device::host)
    tensor::copy(ctx, per_tensor_.data(), device_sums_, n * sizeof(double));  // waits
  for (std::size_t i = 0; i < n; ++i)
    total_ += per_tensor_[i];
  return total_;
}

double GradNorm::compute_shared(const tensor::ExecContext& ctx, const model::ParamStore& store,
                                comm::Communicator& group) {
  if (tensor::device_of(ctx) != tensor::Device::host)
    throw Error("train::GradNorm::compute_shared: the gradients must be in host memory");
  const std::size_t n = store.size();
  per_tensor_.assign(n, 0.0);
  total_ = 0.0;
  if (n == 0) return total_;
  std::size_t first = 0, last = 0;
  comm::SharedSum::part_of(store.buffer_elements(), group.size(), group.rank(), first, last);
  tensor::Tensor out{per_tensor_.data(), {static_cast<std::int64_t>(n)}, DType::f64};
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t middle =
        store.spec(i).offset + static_cast<std::size_t>(store.spec(i).shape.numel()) / 2;
    if (first <= middle && middle < last)
      kernels::sum_of_squares_into(ctx, store.grad(i), out, static_cast<std::int64_t>(i));
  }
  group.allreduce(per_tensor_.data(), n, DType::f64, comm::ReduceOp::sum);
  for (std::size_t i = 0; i < n; ++i)
    total_ += per_tensor_[i];
  return total_;
}

double GradNorm::compute_sharded(const tensor::ExecContext& ctx, const model::ParamStore& store,
                                 std::size_t first, std::size_t last, comm::Communicator& group) {
  if (tensor::device_of(ctx) != tensor::Device::host)
    throw Error("train::GradNorm::compute_sharded: the gradients must be in host memory");
  const std::size_t n = store.size();
  per_tensor_.assign(n, 0.0);
  total_ = 0.0;
  if (n == 0) return total_;
  tensor::Tensor out{per_tensor_.data(), {static_cast<std::int64_t>(n)}, DType::f64};
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t begin = store.spec(i).offset;
    if (begin < first || begin >= last) continue;
    const std::size_t end = begin + static_cast<std::size_t>(store.spec(i).shape.numel());
    if (end > last)
      throw Error("train::GradNorm::compute_sharded: tensor " + store.spec(i).name +
                  " at elements [" + std::to_string(begin) + ", " + std::to_string(end) +
                  ") crosses the end of the shard [" + std::to_string(first) + ", " +
                  std::to_string(last) + ")");
    kernels::sum_of_squares_into(ctx, store.grad(i), out, static_cast<std::int64_t>(i));
  }
  group.allreduce(per_tensor_.data(), n, DType::f64, comm::ReduceOp::sum);
  for (std::size_t i = 0; i < n; ++i)
    total_ += per_tensor_[i];
  return total_;
}

NonFinite first_nonfinite_grad(const tensor::ExecContext& ctx, const model::ParamStore& store) {
  return first_nonfinite_grad(ctx, store, 0, store.buffer_elements());
}

NonFinite first_nonfinite_grad(const tensor::ExecContext& ctx, const model::ParamStore& store,
                               std::size_t first, std::size_t last) {
  for (std::size_t i = 0; i < store.size(); ++i) {
    if (store.spec(i).offset < first || store.spec(i).offset >= last) continue;
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
