#pragma once
/// \file token_rows.hpp
/// How a layer part (a block's attention, its MLP or its DeepSeekMoE layer) meets the
/// residual stream's token rows under tensor parallelism (tensor_parallel.hpp): the one
/// place the block's communication pattern is written. Two layouts of the rows:
///   whole rows (no sequence parallelism): every rank holds the N rows of a micro-batch;
///     a split part (this rank's heads or ffn columns) sums its partial output over the
///     tensor group inside its layers (Compute::reduce_partial), a replicated part
///     (DeepSeekMoE, computed whole on every rank) runs without the group;
///   a rank's rows (sequence parallelism, a group of T ranks; Korthikanti et al. 2022):
///     the residual stream and the norms hold rows [rank N/T, (rank+1) N/T); the norm's
///     rows are all-gathered into the part's (N, C) input; a split part's partial sums are
///     reduce-scattered back to this rank's rows, a replicated part's whole output keeps
///     this rank's rows.
/// Backward mirrors each (the gradient of an all-gather is a reduce-scatter and vice
/// versa); the norm's input gradient is added into the residual stream's gradient.

#include <cstdint>
#include <utility>

#include "model/layers/layer.hpp"
#include "model/layers/rmsnorm.hpp"
#include "model/layers/tensor_parallel.hpp"
#include "tensor/tensor.hpp"

namespace dst::model {

/// How a part computes under tensor parallelism.
enum class Part {
  split,      ///< this rank's slice (heads, ffn columns): its output is a partial sum
  replicated  ///< whole on every rank of the group, its parameters replicated
};

/// The buffers a rank's rows need (sequence parallelism; the model's workspace, shared by
/// every layer): (N, C) the gathered rows a part reads and its partial output (in
/// backward: the gathered gradient of its output), and (C) a norm weight's gradient of one
/// micro-batch (backward only). Empty for whole rows.
struct RowBuffers {
  tensor::Tensor gathered, partial, d_norm;
};

class TokenRows {
 public:
  /// `split`: 1 (whole rows) or the tensor group's size (a rank's rows).
  explicit TokenRows(int split = 1);
  int split() const { return split_; }
  /// The rows a rank keeps of `n`.
  std::int64_t rows(std::int64_t n) const { return n / split_; }

  /// out (this rank's rows) = the part of `in` (this rank's rows of its norm's output):
  /// `run(context, input, output)` computes the part on the rows it reads (every row, or
  /// the gathered rows) in the context the part needs.
  template <class Run>
  void forward(const Compute& c, Part part, const tensor::Tensor& in, const RowBuffers& buf,
               const tensor::Tensor& out, Run&& run) const {
    if (split_ == 1) {
      run(part == Part::replicated ? replicated(c) : c, in, out);
      return;
    }
    TensorParallel& g = group(c);
    g.all_gather(in, buf.gathered);
    if (part == Part::split) {
      run(keeping_partial(c), buf.gathered, buf.partial);
      g.reduce_scatter(buf.partial, out);
    } else {
      run(replicated(c), buf.gathered, buf.partial);
      keep_own_rows(c, buf.partial, out);
    }
  }

  /// The part's backward and its norm's: d_x (this rank's rows) holds d(loss)/d(the part's
  /// output) on entry and gains d(loss)/d(norm_in) on return. `run(context, d_out, in)`
  /// writes the part's input gradient for the rows it reads into `d_ln` (N, C).
  template <class Run>
  void backward(const Compute& c, Part part, const RmsNorm& norm, const tensor::Tensor& norm_in,
                const RmsNormActs& norm_acts, const RowBuffers& buf, const tensor::Tensor& d_ln,
                const tensor::Tensor& d_x, Run&& run) const {
    if (split_ == 1) {
      run(part == Part::replicated ? replicated(c) : c, d_x, norm_acts.out);
      norm.backward(c, d_ln, norm_in, norm_acts, d_x);
      return;
    }
    TensorParallel& g = group(c);
    c.store(d_x);  // as the part's backward rounds its output gradient in place
    g.all_gather(d_x, buf.partial);
    g.all_gather(norm_acts.out, buf.gathered);
    if (part == Part::split) {
      // This rank's share of every row's input gradient, summed over the group and
      // scattered back to its rows.
      run(keeping_partial(c), buf.partial, buf.gathered);
      const tensor::Tensor d_rows = row_range(buf.gathered, 0, d_x.shape[0]);
      g.reduce_scatter(d_ln, d_rows);
      norm.backward_rows(c, d_rows, norm_in, norm_acts, d_x, buf.d_norm);
    } else {
      // Every rank computed the same whole gradient: its own rows, nothing summed.
      run(replicated(c), buf.partial, buf.gathered);
      norm.backward_rows(c, own_rows(c, d_ln, d_x.shape[0]), norm_in, norm_acts, d_x, buf.d_norm);
    }
  }

  /// A norm's backward over this rank's rows (RmsNorm::backward); under a rank's rows its
  /// weight's gradient is summed over the group first, through buf.d_norm
  /// (RmsNorm::backward_rows).
  void norm_backward(const Compute& c, const RmsNorm& norm, const tensor::Tensor& dout,
                     const tensor::Tensor& x, const RmsNormActs& a, const tensor::Tensor& dx,
                     const RowBuffers& buf) const;
  /// Every row of `own` (this rank's rows): `own` itself for whole rows; under a rank's
  /// rows the group's rows all-gathered into `whole` (N, C), which is returned.
  tensor::Tensor every_row(const Compute& c, const tensor::Tensor& own,
                           const tensor::Tensor& whole) const;
  /// Under a rank's rows: `own` = this rank's rows of the group's sum of `whole` (N, C), a
  /// reduce-scatter. Throws dst::Error for whole rows (the layers sum in place there).
  void sum_own_rows(const Compute& c, const tensor::Tensor& whole, const tensor::Tensor& own) const;

  /// `c` without the tensor group: a replicated part's context (its shared experts' MLP
  /// then does not sum its output over the group).
  static Compute replicated(const Compute& c);

 private:
  /// The tensor group the rows are split over (throws dst::Error when `c` lacks it).
  TensorParallel& group(const Compute& c) const;
  /// `c` for a split part under a rank's rows: it keeps its partial sums.
  Compute keeping_partial(const Compute& c) const;
  /// This rank's `n` rows of `whole`, a tensor of every row of the group (rank order).
  tensor::Tensor own_rows(const Compute& c, const tensor::Tensor& whole, std::int64_t n) const;
  /// out = this rank's rows of `whole`.
  void keep_own_rows(const Compute& c, const tensor::Tensor& whole,
                     const tensor::Tensor& out) const;

  int split_ = 1;
};

}  // namespace dst::model
