#include "model/layers/layer.hpp"

#include <utility>

#include "kernels/kernels.hpp"
#include "model/layers/tensor_parallel.hpp"

namespace dst::model {

tensor::Tensor Compute::weight(std::size_t i) const {
  tensor::Tensor t = params->param(i);
  if (compute_base) t.data = compute_base + params->spec(i).offset;
  return t;
}

void Compute::store(const tensor::Tensor& t) const {
  if (storage != DType::f32) kernels::round_to_storage(ctx, t, storage);
}

void Compute::reduce_partial(const tensor::Tensor& t) const {
  if (tensor != nullptr && tensor->size() > 1 && !keep_partial) tensor->all_reduce(t);
}

void Compute::reduce_kv_replicas(const tensor::Tensor& t) const {
  if (tensor != nullptr) tensor->all_reduce_kv_replicas(t);
}

void Compute::reduce_replicated(const tensor::Tensor& t) const {
  if (tensor != nullptr && tensor->size() > 1) tensor->all_reduce(t);
}

int Compute::tensor_rank() const {
  return tensor != nullptr ? tensor->rank() : 0;
}

void add_param(std::vector<ParamSpec>& specs, std::string name, const tensor::Shape& shape,
               Init init, float std, bool weight_decay, Split split) {
  specs.push_back(ParamSpec{std::move(name), shape, init, std, weight_decay, 0, split});
}

tensor::Tensor row_range(const tensor::Tensor& t, std::int64_t first, std::int64_t n) {
  tensor::Tensor r = t;
  const std::int64_t width = t.shape.rank == 1 ? 1 : t.shape[1];
  r.data =
      static_cast<char*>(t.data) + first * width * static_cast<std::int64_t>(dtype_size(t.dtype));
  r.shape = t.shape.rank == 1 ? tensor::Shape{n} : tensor::Shape{n, width};
  return r;
}

}  // namespace dst::model
