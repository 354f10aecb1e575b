#include "model/layers/tensor_parallel.hpp"

#include <string>

#include "core/error.hpp"

namespace dst::model {

namespace {
/// t's elements: an f32 tensor in host memory, or dst::Error.
std::size_t host_floats(const tensor::Tensor& t) {
  if (t.dtype != DType::f32 || t.device != tensor::Device::host)
    throw Error("model: tensor parallelism communicates f32 host tensors only");
  return static_cast<std::size_t>(t.numel());
}

/// The number of f32 values in `local`, after checking that `whole` is `size` of it
/// stacked by rows.
std::size_t local_count(const tensor::Tensor& whole, const tensor::Tensor& local, int size,
                        const char* what) {
  host_floats(whole);
  const auto n = host_floats(local);
  const std::int64_t rows = whole.shape.rank > 0 ? whole.shape[0] : 0;
  bool fits = whole.shape.rank > 0 && local.shape.rank == whole.shape.rank && rows % size == 0 &&
              local.shape[0] == rows / size;
  for (int i = 1; fits && i < whole.shape.rank; ++i)
    fits = local.shape[i] == whole.shape[i];
  if (!fits)
    throw Error(std::string("model: tensor parallel ") + what + " of " + whole.shape.str() +
                " to " + local.shape.str() + " over " + std::to_string(size) +
                " ranks: the group size must divide the rows and the local tensor must hold "
                "one share of them, with the same width");
  return n;
}
}  // namespace

void TensorParallel::all_reduce(const tensor::Tensor& t) {
  const std::size_t n = host_floats(t);
  counted(n * sizeof(float),
          [&] { group_.allreduce(t.ptr<float>(), n, DType::f32, comm::ReduceOp::sum); });
}

void TensorParallel::reduce_scatter(const tensor::Tensor& whole, const tensor::Tensor& local) {
  const std::size_t n = local_count(whole, local, size(), "reduce-scatter");
  counted(n * size() * sizeof(float) / 2, [&] {
    group_.reduce_scatter(whole.ptr<float>(), local.ptr<float>(), n, DType::f32,
                          comm::ReduceOp::sum);
  });
}

void TensorParallel::all_gather(const tensor::Tensor& local, const tensor::Tensor& whole) {
  const std::size_t n = local_count(whole, local, size(), "all-gather");
  counted(n * size() * sizeof(float) / 2,
          [&] { group_.allgather(local.ptr<float>(), whole.ptr<float>(), n, DType::f32); });
}

void TensorParallel::all_reduce_kv_replicas(const tensor::Tensor& t) {
  if (kv_replicas_ == nullptr || kv_replicas_->size() == 1) return;
  const std::size_t n = host_floats(t);
  counted(n * sizeof(float),
          [&] { kv_replicas_->allreduce(t.ptr<float>(), n, DType::f32, comm::ReduceOp::sum); });
}

}  // namespace dst::model
