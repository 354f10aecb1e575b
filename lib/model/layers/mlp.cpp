#include "model/layers/mlp.hpp"

#include <utility>

#include "blas/gemm.hpp"
#include "kernels/kernels.hpp"

namespace dst::model {

Mlp::Mlp(std::string prefix, std::int64_t dim, std::int64_t ffn_dim, float out_std,
         int tensor_parallel)
    : prefix_(std::move(prefix)),
      dim_(dim),
      ffn_dim_(ffn_dim / tensor_parallel),
      out_std_(out_std) {}

void Mlp::declare(std::vector<ParamSpec>& specs) const {
  const std::int64_t C = dim_, F = ffn_dim_;
  add_param(specs, prefix_ + "gate_proj.weight", {F, C}, Init::normal, kInitStd, true,
            Split::column);  // w1
  add_param(specs, prefix_ + "up_proj.weight", {F, C}, Init::normal, kInitStd, true,
            Split::column);  // w3
  add_param(specs, prefix_ + "down_proj.weight", {C, F}, Init::normal, out_std_, true,
            Split::row);  // w2
}

void Mlp::bind(const ParamStore& params) {
  gate_ = params.index_of(prefix_ + "gate_proj.weight");
  up_ = params.index_of(prefix_ + "up_proj.weight");
  down_ = params.index_of(prefix_ + "down_proj.weight");
}

MlpActs Mlp::take(tensor::Arena& arena, std::int64_t rows) const {
  MlpActs a;
  a.h1 = arena.take("h1", {rows, ffn_dim_}, DType::f32);
  a.h3 = arena.take("h3", {rows, ffn_dim_}, DType::f32);
  a.g = arena.take("g", {rows, ffn_dim_}, DType::f32);
  return a;
}

MlpScratch Mlp::take_scratch(tensor::Arena& arena, std::int64_t rows) const {
  return MlpScratch{arena.take("d_g", {rows, ffn_dim_}, DType::f32)};
}

void Mlp::forward(const Compute& c, const tensor::Tensor& x, const MlpActs& a,
                  const tensor::Tensor& out) const {
  blas::linear_forward(c.ctx, x, c.weight(gate_), a.h1);
  blas::linear_forward(c.ctx, x, c.weight(up_), a.h3);
  c.store(a.h1);
  c.store(a.h3);
  kernels::swiglu_forward(c.ctx, a.h1, a.h3, a.g);
  c.store(a.g);
  blas::linear_forward(c.ctx, a.g, c.weight(down_), out);
  c.reduce_partial(out);  // tensor parallelism: this rank's ffn columns' share
}

void Mlp::backward(const Compute& c, const tensor::Tensor& dout, const tensor::Tensor& x,
                   const MlpActs& a, const MlpScratch& s, const tensor::Tensor& dx) const {
  c.store(dout);
  blas::linear_backward(c.ctx, dout, a.g, c.weight(down_), s.d_g, c.grad(down_));
  // d_h1 and d_h3 overwrite h1 and h3, which nothing reads after this (swiglu_backward
  // allows the alias): two (N, F) buffers fewer in the workspace.
  const tensor::Tensor& d_h1 = a.h1;
  const tensor::Tensor& d_h3 = a.h3;
  kernels::swiglu_backward(c.ctx, s.d_g, a.h1, a.h3, d_h1, d_h3);
  c.store(d_h1);
  c.store(d_h3);
  blas::linear_backward(c.ctx, d_h1, x, c.weight(gate_), dx, c.grad(gate_));
  blas::linear_backward(c.ctx, d_h3, x, c.weight(up_), dx, c.grad(up_), true);
  c.reduce_partial(dx);
}

}  // namespace dst::model
