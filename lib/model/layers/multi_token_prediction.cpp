#include "model/layers/multi_token_prediction.hpp"

#include <string>

#include "blas/gemm.hpp"
#include "core/error.hpp"
#include "kernels/kernels.hpp"

namespace dst::model {

namespace {
std::string mtp_prefix(const config::ModelSection& m) {
  return "model.layers." + std::to_string(m.n_layers) + ".";
}
}  // namespace

MultiTokenPrediction::MultiTokenPrediction(const config::ModelSection& m, int tensor_parallel,
                                           const ExpertSlice& ep, bool sequence_parallel)
    : enorm_(mtp_prefix(m) + "enorm.weight", m.d_model, static_cast<float>(m.norm_eps)),
      hnorm_(mtp_prefix(m) + "hnorm.weight", m.d_model, static_cast<float>(m.norm_eps)),
      eh_name_(mtp_prefix(m) + "eh_proj.weight"),
      block_(m, m.n_layers, tensor_parallel, ep, sequence_parallel),
      head_(m, mtp_prefix(m) + "shared_head.norm.weight", tensor_parallel,
            sequence_parallel ? tensor_parallel : 1),
      C_(m.d_model),
      rows_(sequence_parallel ? tensor_parallel : 1) {
  if (m.mtp_depth != 1)
    throw Error("model: a multi-token prediction module needs model.mtp_depth 1, got " +
                std::to_string(m.mtp_depth));
}

void MultiTokenPrediction::declare(std::vector<ParamSpec>& specs) const {
  enorm_.declare(specs);
  hnorm_.declare(specs);
  // (C, 2C): a linear layer of the concatenation, replicated under tensor parallelism
  // (every rank computes the block's whole input from whole inputs: its gradient is the
  // same on every rank).
  add_param(specs, eh_name_, {C_, 2 * C_}, Init::normal, kInitStd, true, Split::replicated);
  block_.declare(specs);
  head_.declare(specs);
}

void MultiTokenPrediction::bind(const ParamStore& params) {
  enorm_.bind(params);
  hnorm_.bind(params);
  eh_proj_ = params.index_of(eh_name_);
  block_.bind(params);
  head_.bind(params);
}

MtpActs MultiTokenPrediction::take(tensor::Arena& arena, std::int64_t B, std::int64_t T, bool fused,
                                   config::Recompute recompute, const BlockActs& shared) const {
  const std::int64_t N = B * T, R = rows(N);
  MtpActs a;
  a.tokens = arena.take("mtp_tokens", {N}, DType::i32);
  a.targets = arena.take("mtp_targets", {N}, DType::i32);
  a.emb = arena.take("mtp_emb", {R, C_}, DType::f32);
  a.enorm = enorm_.take(arena, R, "mtp_enorm", "mtp_enorm_rstd");
  a.hnorm = hnorm_.take(arena, R, "mtp_hnorm", "mtp_hnorm_rstd");
  a.block = block_.take(arena, B, T, fused, recompute, shared);
  a.head = head_.take(arena, N);
  return a;
}

MtpScratch MultiTokenPrediction::take_scratch(tensor::Arena& arena, std::int64_t N) const {
  MtpScratch s;
  s.d_h = arena.take("mtp_d_h", {rows(N), C_}, DType::f32);
  s.d_main = arena.take("mtp_d_main", {rows(N), C_}, DType::f32);
  return s;
}

void MultiTokenPrediction::make_targets(const std::int32_t* targets, std::int64_t B, std::int64_t T,
                                        std::int32_t* mtp_tokens, std::int32_t* mtp_targets) {
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int32_t* tgt = targets + b * T;  // s[1..T] of sample b
    for (std::int64_t t = 0; t < T; ++t) {
      const std::int32_t next = tgt[t];  // s[t + 1]: the module's input at t
      mtp_tokens[b * T + t] = next == kIgnoreIndex ? 0 : next;
      mtp_targets[b * T + t] = t + 1 < T ? tgt[t + 1] : kIgnoreIndex;  // s[t + 2]
    }
  }
}

void MultiTokenPrediction::forward(const Compute& c, const Embedding& embedding, const Rope& rope,
                                   std::int64_t B, std::int64_t T, const tensor::Tensor& h,
                                   const MtpActs& a) const {
  const std::int64_t R = rows(B * T);
  embedding.forward(c, a.tokens, a.emb, {a.block.gathered, a.block.partial, {}});
  enorm_.forward(c, a.emb, a.enorm);
  hnorm_.forward(c, h, a.hnorm);
  // eh_proj of the concatenation without forming it: x = e W[:, :C]^T + h W[:, C:]^T, the
  // two column halves of W (C, 2C) read with its row stride 2C.
  const float* w = c.weight(eh_proj_).ptr<float>();
  float* x = a.block.x.ptr<float>();
  blas::gemm(c.ctx, blas::Trans::no, blas::Trans::yes, R, C_, C_, 1.0f, a.enorm.out.ptr<float>(),
             C_, w, 2 * C_, 0.0f, x, C_);
  blas::gemm(c.ctx, blas::Trans::no, blas::Trans::yes, R, C_, C_, 1.0f, a.hnorm.out.ptr<float>(),
             C_, w + C_, 2 * C_, 1.0f, x, C_);
  c.store(a.block.x);
  block_.forward(c, rope, B, T, a.block, a.head.x);
  head_.forward(c, a.head);
}

void MultiTokenPrediction::loss(const Compute& c, const MtpActs& a) const {
  head_.loss(c, a.head, a.targets);
}

void MultiTokenPrediction::loss_and_gradient(const Compute& c, const MtpActs& a,
                                             float grad_scale) const {
  head_.loss_and_gradient(c, a.head, a.targets, grad_scale);
}

void MultiTokenPrediction::backward(const Compute& c, const Embedding& embedding, const Rope& rope,
                                    std::int64_t B, std::int64_t T, const tensor::Tensor& h,
                                    const MtpActs& a, const BlockScratch& bs, const MtpScratch& s,
                                    const tensor::Tensor& d_x, const OnReady& ready) const {
  const std::int64_t N = B * T, R = rows(N);
  const RowBuffers buf{a.block.gathered, a.block.partial, bs.d_norm};
  const tensor::Tensor dx = row_range(d_x, 0, R);  // this rank's rows
  // dx (d_x): d(loss)/d(the block's output), then d(loss)/d(eh_proj's output).
  head_.backward(c, a.head, bs.d_ln, dx, ready, {}, buf);
  block_.backward(c, rope, B, T, a.block, bs, dx, ready);
  // eh_proj: d_e = dy W[:, :C], d_h = dy W[:, C:]; dW[:, :C] += dy^T e, dW[:, C:] += dy^T h.
  c.store(dx);
  const float* w = c.weight(eh_proj_).ptr<float>();
  float* dw = c.grad(eh_proj_).ptr<float>();
  const tensor::Tensor d_e = row_range(bs.d_ln, 0, R);
  blas::gemm(c.ctx, blas::Trans::no, blas::Trans::no, R, C_, C_, 1.0f, dx.ptr<float>(), C_, w,
             2 * C_, 0.0f, d_e.ptr<float>(), C_);
  blas::gemm(c.ctx, blas::Trans::no, blas::Trans::no, R, C_, C_, 1.0f, dx.ptr<float>(), C_, w + C_,
             2 * C_, 0.0f, s.d_h.ptr<float>(), C_);
  // The weight's gradient sums over every token row: a rank's rows are gathered first (the
  // output gradient into the block's partial-sum buffer, each input in turn into its
  // gathered-rows buffer), so every rank computes the same whole sum.
  const float* dy = rows_.every_row(c, dx, a.block.partial).ptr<float>();
  const float* e = rows_.every_row(c, a.enorm.out, a.block.gathered).ptr<float>();
  blas::gemm(c.ctx, blas::Trans::yes, blas::Trans::no, C_, C_, N, 1.0f, dy, C_, e, C_, 1.0f, dw,
             2 * C_);
  const float* hn = rows_.every_row(c, a.hnorm.out, a.block.gathered).ptr<float>();
  blas::gemm(c.ctx, blas::Trans::yes, blas::Trans::no, C_, C_, N, 1.0f, dy, C_, hn, C_, 1.0f,
             dw + C_, 2 * C_);
  // The norms accumulate their input gradients: into zeroed buffers. d_x is free now.
  kernels::zero(c.ctx, dx);
  kernels::zero(c.ctx, s.d_main);
  rows_.norm_backward(c, enorm_, d_e, a.emb, a.enorm, dx, buf);
  embedding.backward(c, a.tokens, dx, buf);  // the shared table's rows of the tokens t+1
  rows_.norm_backward(c, hnorm_, s.d_h, h, a.hnorm, s.d_main, buf);
  ready(c.offset(enorm_.weight()));  // the module's first tensor: all of it is final
}

}  // namespace dst::model
