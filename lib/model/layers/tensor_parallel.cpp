#include "model/layers/tensor_parallel.hpp"

#include "core/error.hpp"

namespace dst::model {

namespace {
/// t's elements: an f32 tensor in host memory, or dst::Error.
std::size_t host_floats(const tensor::Tensor& t) {
  if (t.dtype != DType::f32 || t.device != tensor::Device::host)
    throw Error("model: tensor parallelism reduces f32 host tensors only");
  return static_cast<std::size_t>(t.numel());
}
}  // namespace

void TensorParallel::all_reduce(const tensor::Tensor& t) {
  const std::size_t n = host_floats(t);
  counted(n * sizeof(float),
          [&] { group_.allreduce(t.ptr<float>(), n, DType::f32, comm::ReduceOp::sum); });
}

void TensorParallel::all_reduce_kv_replicas(const tensor::Tensor& t) {
  if (kv_replicas_ == nullptr || kv_replicas_->size() == 1) return;
  const std::size_t n = host_floats(t);
  counted(n * sizeof(float),
          [&] { kv_replicas_->allreduce(t.ptr<float>(), n, DType::f32, comm::ReduceOp::sum); });
}

}  // namespace dst::model
