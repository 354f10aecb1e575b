#pragma once
/// \file head.hpp
/// The output head and the loss: final RMSNorm, lm_head (or the embedding table when the
/// embeddings are tied) to logits, cross-entropy with an ignore index.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "config/run_config.hpp"
#include "model/layers/layer.hpp"
#include "model/layers/rmsnorm.hpp"
#include "model/layers/token_rows.hpp"
#include "model/layers/vocab_parallel.hpp"
#include "tensor/arena.hpp"

namespace dst::model {

/// Targets equal to this are padding: no loss, no gradient (PyTorch's default).
inline constexpr std::int32_t kIgnoreIndex = -100;

/// What the head keeps from forward for backward.
/// Under sequence parallelism (a group of T) x and the norm's statistics are this rank's
/// N / T rows, which `rows` normalises and norm.out gathers.
struct HeadActs {
  tensor::Tensor x;       // (N, C) its input: the last block's output (or N/T rows)
  RmsNormActs norm;       // (N, C), (N) (or every row gathered, N/T statistics)
  tensor::Tensor rows;    // (N/T, C) sequence parallelism: this rank's normalised rows
  tensor::Tensor logits;  // (N, V); d(loss)/d(logits) after loss_and_gradient()
  tensor::Tensor losses;  // (N) per-token losses, fp32
  /// Tensor parallelism: the cross-entropy's per-row scratch over the split vocabulary.
  CrossEntropyScratch vocab_scratch;
};

class Head {
 public:
  /// The model's head: model.norm.weight and lm_head.weight (or the tied embedding).
  /// `tensor_parallel` T: this rank holds vocab / T rows of the projection (its slice,
  /// tensor_parallel.hpp), computes those logits and the loss over the split vocabulary
  /// (vocab_parallel_cross_entropy). `row_split` (sequence parallelism: T): its input and
  /// norm are this rank's N / T rows (token_rows.hpp), gathered before the projection.
  explicit Head(const config::ModelSection& m, int tensor_parallel = 1, int row_split = 1);
  /// A head with its own final norm named `norm_name` that shares the model's projection
  /// (lm_head.weight, or the tied embedding): the multi-token prediction module's
  /// shared_head. It declares only its norm. `tensor_parallel` T: the projection's
  /// vocabulary slice, as the model's head.
  Head(const config::ModelSection& m, std::string norm_name, int tensor_parallel = 1,
       int row_split = 1);

  /// model.norm.weight, then lm_head.weight (V, C) split by vocabulary rows unless the
  /// embeddings are tied (or the projection is shared).
  void declare(std::vector<ParamSpec>& specs) const;
  void bind(const ParamStore& params);

  /// The record of N token rows (this rank's N / T of them under sequence parallelism).
  HeadActs take(tensor::Arena& arena, std::int64_t rows) const;

  /// a.logits (N, V / tensor_parallel) = lm_head(rmsnorm(a.x)); keeps a.norm (and a.rows).
  /// Under sequence parallelism the norm of this rank's rows into a.rows, all-gathered
  /// into a.norm.out, then the logits of every row.
  void forward(const Compute& c, const HeadActs& a) const;
  /// Whole rows only (the decoder's): logits = lm_head(rmsnorm(x)) for x (N, C); keeps norm.
  void forward(const Compute& c, const tensor::Tensor& x, const RmsNormActs& norm,
               const tensor::Tensor& logits) const;
  /// This rank's rows of the normalised output (a.norm.out, or a.rows under sequence
  /// parallelism): what the multi-token prediction module reads.
  const tensor::Tensor& normalised(const HeadActs& a) const {
    return rows_.split() == 1 ? a.norm.out : a.rows;
  }
  /// a.losses: the per-token cross-entropy of a.logits against targets (N) i32 (0 where
  /// a target is kIgnoreIndex).
  void loss(const Compute& c, const HeadActs& a, const tensor::Tensor& targets) const;
  /// The same, and a.logits becomes d(grad_scale * sum of losses)/d(logits) in place.
  void loss_and_gradient(const Compute& c, const HeadActs& a, const tensor::Tensor& targets,
                         float grad_scale) const;
  /// d_x (this rank's rows) = d(loss)/d(a.x) (written) from the gradient in a.logits;
  /// accumulates the weights' gradients, using d_ln (N, C) as scratch. `d_out` (this rank's
  /// rows), if not empty, is a further d(loss)/d(the normalised output) from another reader
  /// of it (the multi-token prediction module), added before the norm's backward. Under
  /// sequence parallelism the projection's partial input gradient is reduce-scattered into
  /// this rank's rows of buf.gathered and the norm weight's gradient summed over the group
  /// through buf.d_norm. Calls ready() when the head's own gradients are final (not when
  /// tied: the embedding's backward adds to them; a shared projection: only its norm,
  /// which the model's head does not touch).
  void backward(const Compute& c, const HeadActs& a, const tensor::Tensor& d_ln,
                const tensor::Tensor& d_x, const OnReady& ready, const tensor::Tensor& d_out = {},
                const RowBuffers& buf = {}) const;

 private:
  RmsNorm norm_;
  bool tied_;
  bool shared_ = false;       ///< the projection is the model's head (declared there)
  std::int64_t vocab_, dim_;  ///< vocab_: the whole vocabulary
  int tp_ = 1;
  TokenRows rows_;
  /// This rank's vocabulary rows under tensor parallelism (throws without the group).
  VocabSlice slice(const Compute& c) const;
  /// Calls ready() when the head's own gradients are final (backward()).
  void head_ready(const Compute& c, const OnReady& ready) const;
  std::size_t head_ = 0;
};

}  // namespace dst::model
