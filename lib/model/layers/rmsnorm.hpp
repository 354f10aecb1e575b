#pragma once
/// \file rmsnorm.hpp
/// RMSNorm: out = x / rms(x) * weight, over the last dimension (fp32 statistics).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "model/layers/layer.hpp"
#include "tensor/arena.hpp"

namespace dst::model {

/// What an RMSNorm keeps from forward for backward (with its input, which the caller
/// keeps: the residual stream).
struct RmsNormActs {
  tensor::Tensor out;   // (N, dim) normalised rows, stored
  tensor::Tensor rstd;  // (N)      1 / rms of each row, fp32
};

class RmsNorm {
 public:
  /// `name`: the weight's full parameter name ("model.layers.0.input_layernorm.weight").
  RmsNorm(std::string name, std::int64_t dim, float eps);

  /// The weight (dim), ones at initialisation, no weight decay, replicated.
  void declare(std::vector<ParamSpec>& specs) const;
  void bind(const ParamStore& params);
  std::size_t weight() const { return weight_; }

  /// The activation record of `rows` rows, named `out_name` and `rstd_name` in the arena.
  RmsNormActs take(tensor::Arena& arena, std::int64_t rows, const std::string& out_name,
                   const std::string& rstd_name) const;

  /// a.out, a.rstd from x (N, dim).
  void forward(const Compute& c, const tensor::Tensor& x, const RmsNormActs& a) const;
  /// Accumulates d(loss)/dx into dx (N, dim) from dout (N, dim), and the weight's gradient.
  void backward(const Compute& c, const tensor::Tensor& dout, const tensor::Tensor& x,
                const RmsNormActs& a, const tensor::Tensor& dx) const;
  /// The same, accumulating the weight's gradient into `d_weight` (dim) instead of the
  /// parameter's (sequence parallelism sums it over the tensor group first).
  void backward(const Compute& c, const tensor::Tensor& dout, const tensor::Tensor& x,
                const RmsNormActs& a, const tensor::Tensor& dx,
                const tensor::Tensor& d_weight) const;
  /// Sequence parallelism: backward() over this rank's token rows, the weight's gradient
  /// from them (through `scratch`, dim) summed over the tensor group (c.tensor) before it
  /// is added to the parameter's, so every rank of the group holds the same gradient.
  void backward_rows(const Compute& c, const tensor::Tensor& dout, const tensor::Tensor& x,
                     const RmsNormActs& a, const tensor::Tensor& dx,
                     const tensor::Tensor& scratch) const;

 private:
  std::string name_;
  std::int64_t dim_;
  float eps_;
  std::size_t weight_ = 0;
};

}  // namespace dst::model
