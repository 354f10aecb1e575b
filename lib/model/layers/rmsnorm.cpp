#include "model/layers/rmsnorm.hpp"

#include <utility>

#include "core/error.hpp"
#include "kernels/kernels.hpp"
#include "model/layers/tensor_parallel.hpp"

namespace dst::model {

RmsNorm::RmsNorm(std::string name, std::int64_t dim, float eps)
    : name_(std::move(name)), dim_(dim), eps_(eps) {}

void RmsNorm::declare(std::vector<ParamSpec>& specs) const {
  add_param(specs, name_, {dim_}, Init::ones, 0.0f, false, Split::replicated);
}

void RmsNorm::bind(const ParamStore& params) {
  weight_ = params.index_of(name_);
}

RmsNormActs RmsNorm::take(tensor::Arena& arena, std::int64_t rows, const std::string& out_name,
                          const std::string& rstd_name) const {
  RmsNormActs a;
  a.out = arena.take(out_name, {rows, dim_}, DType::f32);
  a.rstd = arena.take(rstd_name, {rows}, DType::f32);
  return a;
}

void RmsNorm::forward(const Compute& c, const tensor::Tensor& x, const RmsNormActs& a) const {
  kernels::rmsnorm_forward(c.ctx, x, c.weight(weight_), eps_, a.out, a.rstd);
  c.store(a.out);  // the statistics stay fp32
}

void RmsNorm::backward(const Compute& c, const tensor::Tensor& dout, const tensor::Tensor& x,
                       const RmsNormActs& a, const tensor::Tensor& dx) const {
  backward(c, dout, x, a, dx, c.grad(weight_));
}

void RmsNorm::backward(const Compute& c, const tensor::Tensor& dout, const tensor::Tensor& x,
                       const RmsNormActs& a, const tensor::Tensor& dx,
                       const tensor::Tensor& d_weight) const {
  kernels::rmsnorm_backward(c.ctx, dout, x, c.weight(weight_), a.rstd, dx, d_weight);
}

void RmsNorm::backward_rows(const Compute& c, const tensor::Tensor& dout, const tensor::Tensor& x,
                            const RmsNormActs& a, const tensor::Tensor& dx,
                            const tensor::Tensor& scratch) const {
  if (c.tensor == nullptr) throw Error("model: " + name_ + ": split rows need the tensor group");
  kernels::zero(c.ctx, scratch);
  backward(c, dout, x, a, dx, scratch);
  c.tensor->all_reduce(scratch);  // every rank's rows
  const tensor::Tensor g = c.grad(weight_);
  kernels::add(c.ctx, g, scratch, g);
}

}  // namespace dst::model
