#include "model/layers/head.hpp"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "blas/gemm.hpp"
#include "core/error.hpp"
#include "kernels/kernels.hpp"
#include "model/layers/embedding.hpp"
#include "model/layers/tensor_parallel.hpp"

namespace dst::model {

namespace {
constexpr const char* kHeadName = "lm_head.weight";
constexpr const char* kTiedName = kEmbeddingTableName;  // Embedding's table
}  // namespace

Head::Head(const config::ModelSection& m, int tensor_parallel, int row_split)
    : norm_("model.norm.weight", m.d_model, static_cast<float>(m.norm_eps)),
      tied_(m.tie_embeddings),
      vocab_(m.vocab_size),
      dim_(m.d_model),
      tp_(tensor_parallel),
      rows_(row_split) {}

Head::Head(const config::ModelSection& m, std::string norm_name, int tensor_parallel, int row_split)
    : norm_(std::move(norm_name), m.d_model, static_cast<float>(m.norm_eps)),
      tied_(m.tie_embeddings),
      shared_(true),
      vocab_(m.vocab_size),
      dim_(m.d_model),
      tp_(tensor_parallel),
      rows_(row_split) {}

void Head::declare(std::vector<ParamSpec>& specs) const {
  norm_.declare(specs);
  if (!tied_ && !shared_)
    add_param(specs, kHeadName, {vocab_ / tp_, dim_}, Init::normal, kInitStd, true, Split::vocab);
}

void Head::bind(const ParamStore& params) {
  norm_.bind(params);
  head_ = params.index_of(tied_ ? kTiedName : kHeadName);
}

HeadActs Head::take(tensor::Arena& arena, std::int64_t rows) const {
  HeadActs a;
  const std::int64_t own = rows_.rows(rows);
  a.x = arena.take("final_x", {own, dim_}, DType::f32);
  if (own == rows) {
    a.norm = norm_.take(arena, rows, "lnf", "rstdf");
  } else {
    a.rows = arena.take("lnf rows", {own, dim_}, DType::f32);
    a.norm.out = arena.take("lnf", {rows, dim_}, DType::f32);
    a.norm.rstd = arena.take("rstdf", {own}, DType::f32);
  }
  a.logits = arena.take("logits", {rows, vocab_ / tp_}, DType::f32);
  a.losses = arena.take("losses", {rows}, DType::f32);
  if (tp_ > 1) {
    a.vocab_scratch.keys = arena.take("row maxima", {rows}, DType::i32);
    a.vocab_scratch.sums = arena.take("row sums", {rows, 2}, DType::f64);
  }
  return a;
}

void Head::forward(const Compute& c, const HeadActs& a) const {
  if (rows_.split() == 1) {
    forward(c, a.x, a.norm, a.logits);
    return;
  }
  norm_.forward(c, a.x, RmsNormActs{a.rows, a.norm.rstd});
  rows_.every_row(c, a.rows, a.norm.out);
  blas::linear_forward(c.ctx, a.norm.out, c.weight(head_), a.logits);
  c.store(a.logits);
}

void Head::forward(const Compute& c, const tensor::Tensor& x, const RmsNormActs& norm,
                   const tensor::Tensor& logits) const {
  norm_.forward(c, x, norm);
  blas::linear_forward(c.ctx, norm.out, c.weight(head_), logits);
  c.store(logits);  // the loss itself is computed in fp32 from the stored logits
}

namespace {
/// The vocabulary-parallel cross-entropy's all-reduces: a row's maximum (an i32 key), its
/// sum of exponentials and its target's logit (f64), for each of the N rows.
std::uint64_t cross_entropy_bytes(const HeadActs& a) {
  return static_cast<std::uint64_t>(a.logits.shape[0]) *
         (sizeof(std::int32_t) + 2 * sizeof(double));
}
}  // namespace

VocabSlice Head::slice(const Compute& c) const {
  return VocabSlice::of_group(vocab_, c.tensor, tp_, "the head");
}

void Head::loss(const Compute& c, const HeadActs& a, const tensor::Tensor& targets) const {
  if (tp_ > 1) {
    // The loss only: the logits stay as they are (LanguageModel::logits()).
    const VocabSlice s = slice(c);
    c.tensor->counted(cross_entropy_bytes(a), [&] {
      vocab_parallel_cross_entropy(c.ctx, c.tensor->group(), s, a.logits, targets, kIgnoreIndex,
                                   0.0f, false, a.losses, a.vocab_scratch);
    });
    return;
  }
  kernels::cross_entropy_forward(c.ctx, a.logits, targets, kIgnoreIndex, a.losses);
}

void Head::loss_and_gradient(const Compute& c, const HeadActs& a, const tensor::Tensor& targets,
                             float grad_scale) const {
  if (tp_ > 1) {
    const VocabSlice s = slice(c);
    c.tensor->counted(cross_entropy_bytes(a), [&] {
      vocab_parallel_cross_entropy(c.ctx, c.tensor->group(), s, a.logits, targets, kIgnoreIndex,
                                   grad_scale, true, a.losses, a.vocab_scratch);
    });
    return;
  }
  kernels::cross_entropy_fused(c.ctx, a.logits, targets, kIgnoreIndex, grad_scale, a.losses,
                               a.logits);
}

void Head::backward(const Compute& c, const HeadActs& a, const tensor::Tensor& d_ln,
                    const tensor::Tensor& d_x, const OnReady& ready, const tensor::Tensor& d_out,
                    const RowBuffers& buf) const {
  // Weight gradients accumulate in fp32 (the ParamStore's gradient buffer); the
  // activation gradients that feed matrix products are stored (Compute::store) like the
  // forward's activations, which is where fp16 needs the loss scale.
  c.store(a.logits);
  blas::linear_backward(c.ctx, a.logits, a.norm.out, c.weight(head_), d_ln, c.grad(head_));
  if (rows_.split() == 1) {
    c.reduce_partial(d_ln);  // tensor parallelism: this rank's vocabulary rows' share
    if (!d_out.empty()) kernels::add(c.ctx, d_ln, d_out, d_ln);
    kernels::zero(c.ctx, d_x);
    norm_.backward(c, d_ln, a.x, a.norm, d_x);
  } else {
    // This rank's rows of the vocabulary slices' sum.
    const tensor::Tensor d_rows = row_range(buf.gathered, 0, d_x.shape[0]);
    rows_.sum_own_rows(c, d_ln, d_rows);
    if (!d_out.empty()) kernels::add(c.ctx, d_rows, d_out, d_rows);
    kernels::zero(c.ctx, d_x);
    norm_.backward_rows(c, d_rows, a.x, RmsNormActs{a.rows, a.norm.rstd}, d_x, buf.d_norm);
  }
  head_ready(c, ready);
}

void Head::head_ready(const Compute& c, const OnReady& ready) const {
  // Tied: the head's gradient is the embedding's, final only at the very end. Shared: the
  // projection's gradient is the model head's, final after that head's backward.
  if (shared_)
    ready(c.offset(norm_.weight()));
  else if (!tied_)
    ready(std::min(c.offset(norm_.weight()), c.offset(head_)));
}

}  // namespace dst::model
