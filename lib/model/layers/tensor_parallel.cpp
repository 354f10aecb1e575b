#include "model/layers/tensor_parallel.hpp"

#include <chrono>

#include "core/error.hpp"

namespace dst::model {

void TensorParallel::all_reduce(const tensor::Tensor& t) {
  if (t.dtype != DType::f32 || t.device != tensor::Device::host)
    throw Error("model: tensor parallelism reduces f32 host tensors only");
  const auto t0 = std::chrono::steady_clock::now();
  const auto n = static_cast<std::size_t>(t.numel());
  group_.allreduce(t.ptr<float>(), n, DType::f32, comm::ReduceOp::sum);
  traffic_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  traffic_.bytes += n * sizeof(float);
  ++traffic_.calls;
}

}  // namespace dst::model
