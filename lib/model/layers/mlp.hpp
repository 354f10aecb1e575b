#pragma once
/// \file mlp.hpp
/// The SwiGLU feed-forward layer: out = down(silu(gate(x)) * up(x)).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "model/layers/layer.hpp"
#include "tensor/arena.hpp"

namespace dst::model {

/// What the MLP keeps from forward for backward (with its input, which the block keeps).
/// The backward overwrites h1 and h3 with their gradients (nothing reads them after).
struct MlpActs {
  tensor::Tensor h1;  // (N, F) gate_proj(x)
  tensor::Tensor h3;  // (N, F) up_proj(x)
  tensor::Tensor g;   // (N, F) silu(h1) * h3
};

/// Backward scratch, shared by every MLP of the model.
struct MlpScratch {
  tensor::Tensor d_g;  // (N, F)
};

class Mlp {
 public:
  /// `prefix`: the parameter names' ("model.layers.0.mlp."). `out_std`: down_proj's
  /// initial standard deviation (the residual-scaled kInitStd).
  /// `tensor_parallel` T: this rank computes ffn_dim / T of the hidden columns, its slice
  /// of gate/up (by rows) and down (by columns); T divides ffn_dim (the deck checks it).
  Mlp(std::string prefix, std::int64_t dim, std::int64_t ffn_dim, float out_std,
      int tensor_parallel = 1);

  /// gate_proj (F, dim) and up_proj (F, dim) split by columns (output rows), down_proj
  /// (dim, F) by rows (input columns).
  void declare(std::vector<ParamSpec>& specs) const;
  void bind(const ParamStore& params);
  /// The first parameter's index.
  std::size_t first_param() const { return gate_; }

  MlpActs take(tensor::Arena& arena, std::int64_t rows) const;
  MlpScratch take_scratch(tensor::Arena& arena, std::int64_t rows) const;

  /// out (N, dim) = down(silu(gate(x)) * up(x)) for x (N, dim); keeps a.
  void forward(const Compute& c, const tensor::Tensor& x, const MlpActs& a,
               const tensor::Tensor& out) const;
  /// dx (N, dim) = d(loss)/dx (written) from dout (N, dim), which is rounded in place to the
  /// storage type; accumulates the weights' gradients.
  void backward(const Compute& c, const tensor::Tensor& dout, const tensor::Tensor& x,
                const MlpActs& a, const MlpScratch& s, const tensor::Tensor& dx) const;

 private:
  std::string prefix_;
  std::int64_t dim_;
  std::int64_t ffn_dim_;
  float out_std_;
  std::size_t gate_ = 0, up_ = 0, down_ = 0;
};

}  // namespace dst::model
