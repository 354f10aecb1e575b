#include "model/layers/tensor_parallel.hpp"

#include "core/error.hpp"

namespace dst::model {

void TensorParallel::all_reduce(const tensor::Tensor& t) {
  if (t.dtype != DType::f32 || t.device != tensor::Device::host)
    throw Error("model: tensor parallelism reduces f32 host tensors only");
  const auto n = static_cast<std::size_t>(t.numel());
  counted(n * sizeof(float),
          [&] { group_.allreduce(t.ptr<float>(), n, DType::f32, comm::ReduceOp::sum); });
}

}  // namespace dst::model
