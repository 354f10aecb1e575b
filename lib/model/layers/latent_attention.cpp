#include "model/layers/latent_attention.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "blas/gemm.hpp"
#include "kernels/kernels.hpp"
#include "model/layers/yarn.hpp"

namespace dst::model {

namespace {
using blas::Trans;
using tensor::Tensor;

/// The RMSNorm epsilon of the latents' norms (q_a_layernorm, kv_a_layernorm): DeepSeek's
/// reference and transformers build them with the default 1e-6, not rms_norm_eps.
constexpr float kLatentNormEps = 1.0e-6f;

}  // namespace

LatentAttention::LatentAttention(std::string prefix, const config::ModelSection& m, float out_std,
                                 int tensor_parallel)
    : prefix_(std::move(prefix)),
      C_(m.d_model),
      H_(m.n_heads / tensor_parallel),
      q_lora_(m.q_lora_rank),
      kv_lora_(m.kv_lora_rank),
      nope_(m.qk_nope_head_dim),
      rope_(m.qk_rope_head_dim),
      v_(m.v_head_dim),
      tp_(tensor_parallel),
      out_std_(out_std),
      // YaRN: DeepSeek's mscale^2 on the softmax scale, in double as transformers.
      scale_(m.rope_scaling.type == config::RopeScalingType::none
                 ? 1.0f / std::sqrt(static_cast<float>(m.qk_nope_head_dim + m.qk_rope_head_dim))
                 : static_cast<float>(
                       yarn::softmax_factor(m.rope_scaling) /
                       std::sqrt(static_cast<double>(m.qk_nope_head_dim + m.qk_rope_head_dim)))),
      q_norm_(prefix_ + "q_a_layernorm.weight", m.q_lora_rank, kLatentNormEps),
      kv_norm_(prefix_ + "kv_a_layernorm.weight", m.kv_lora_rank, kLatentNormEps) {
  if (tensor_parallel < 1 || m.n_heads % tensor_parallel != 0)
    throw Error("model: tensor parallelism over " + std::to_string(tensor_parallel) +
                " ranks needs the latent attention's " + std::to_string(m.n_heads) +
                " heads to divide among them");
}

void LatentAttention::declare(std::vector<ParamSpec>& specs) const {
  const std::int64_t qk = nope_ + rope_;
  if (q_lora_ > 0) {
    add_param(specs, prefix_ + "q_a_proj.weight", {q_lora_, C_}, Init::normal, kInitStd, true,
              Split::replicated);
    q_norm_.declare(specs);
    add_param(specs, prefix_ + "q_b_proj.weight", {H_ * qk, q_lora_}, Init::normal, kInitStd, true,
              Split::column);
  } else {
    add_param(specs, prefix_ + "q_proj.weight", {H_ * qk, C_}, Init::normal, kInitStd, true,
              Split::column);
  }
  add_param(specs, prefix_ + "kv_a_proj_with_mqa.weight", {kv_lora_ + rope_, C_}, Init::normal,
            kInitStd, true, Split::replicated);
  kv_norm_.declare(specs);
  add_param(specs, prefix_ + "kv_b_proj.weight", {H_ * (nope_ + v_), kv_lora_}, Init::normal,
            kInitStd, true, Split::column);
  add_param(specs, prefix_ + "o_proj.weight", {C_, H_ * v_}, Init::normal, out_std_, true,
            Split::row);
}

void LatentAttention::bind(const ParamStore& params) {
  if (q_lora_ > 0) {
    q_a_ = params.index_of(prefix_ + "q_a_proj.weight");
    q_norm_.bind(params);
    q_b_ = params.index_of(prefix_ + "q_b_proj.weight");
  } else {
    q_ = params.index_of(prefix_ + "q_proj.weight");
  }
  kv_a_ = params.index_of(prefix_ + "kv_a_proj_with_mqa.weight");
  kv_norm_.bind(params);
  kv_b_ = params.index_of(prefix_ + "kv_b_proj.weight");
  o_ = params.index_of(prefix_ + "o_proj.weight");
}

LatentAttentionActs LatentAttention::take(tensor::Arena& arena, std::int64_t B, std::int64_t T,
                                          bool keep_probs) const {
  const std::int64_t N = B * T;
  LatentAttentionActs a;
  if (q_lora_ > 0) {
    a.q_a = arena.take("mla_q_a", {N, q_lora_}, DType::f32);
    a.q_norm = q_norm_.take(arena, N, "mla_q_n", "mla_q_rstd");
  }
  a.q = arena.take("mla_q", {N, H_ * (nope_ + rope_)}, DType::f32);
  a.c_kv = arena.take("mla_c_kv", {N, kv_lora_}, DType::f32);
  a.kv_norm = kv_norm_.take(arena, N, "mla_kv_n", "mla_kv_rstd");
  a.k_pe = arena.take("mla_k_pe", {N, rope_}, DType::f32);
  a.kv = arena.take("mla_kv", {N, H_ * (nope_ + v_)}, DType::f32);
  if (keep_probs) a.probs = take_probs(arena, B, T);
  a.attn = arena.take("attn", {N, H_ * v_}, DType::f32);
  return a;
}

Tensor LatentAttention::take_probs(tensor::Arena& arena, std::int64_t B, std::int64_t T) const {
  return arena.take("probs", {B, H_, T, T}, DType::f32);
}

void LatentAttention::recompute_probs(const Compute& c, std::int64_t B, std::int64_t T,
                                      const LatentAttentionActs& a) const {
  core_forward(c, B, T, a, false);
}

LatentAttentionScratch LatentAttention::take_scratch(tensor::Arena& arena, std::int64_t B,
                                                     std::int64_t T) const {
  const std::int64_t N = B * T;
  LatentAttentionScratch s;
  s.d_attn = arena.take("d_attn", {N, H_ * v_}, DType::f32);
  s.d_probs = arena.take("d_probs", {B, H_, T, T}, DType::f32);
  s.d_q = arena.take("d_mla_q", {N, H_ * (nope_ + rope_)}, DType::f32);
  s.d_kv = arena.take("d_mla_kv", {N, H_ * (nope_ + v_)}, DType::f32);
  s.d_k_pe = arena.take("d_mla_k_pe", {N, rope_}, DType::f32);
  s.d_kv_n = arena.take("d_mla_kv_n", {N, kv_lora_}, DType::f32);
  s.d_c_kv = arena.take("d_mla_c_kv", {N, kv_lora_}, DType::f32);
  if (q_lora_ > 0) {
    s.d_q_n = arena.take("d_mla_q_n", {N, q_lora_}, DType::f32);
    s.d_q_a = arena.take("d_mla_q_a", {N, q_lora_}, DType::f32);
  }
  return s;
}

void LatentAttention::forward(const Compute& c, const Rope& rope, std::int64_t B, std::int64_t T,
                              const Tensor& x, const LatentAttentionActs& a, const Tensor& out,
                              const LatentKVCache* cache) const {
  const std::int64_t qk = nope_ + rope_;
  if (q_lora_ > 0) {
    blas::linear_forward(c.ctx, x, c.weight(q_a_), a.q_a);
    c.store(a.q_a);
    q_norm_.forward(c, a.q_a, a.q_norm);
    blas::linear_forward(c.ctx, a.q_norm.out, c.weight(q_b_), a.q);
  } else {
    blas::linear_forward(c.ctx, x, c.weight(q_), a.q);
  }
  // kv_a_proj_with_mqa as two products: its first kv_lora rows give the latent, the last
  // rope rows the shared key (the same sums as one product, written where each is used).
  // Decoding writes this call's latents and RoPE keys straight into the cache's rows.
  const std::int64_t p0 = cache ? cache->position : 0;
  const Tensor k_pe = cache ? row_range(cache->k_pe, p0, T) : a.k_pe;
  const RmsNormActs kv_norm =
      cache ? RmsNormActs{row_range(cache->latent, p0, T), a.kv_norm.rstd} : a.kv_norm;
  const Tensor w_kv_a = c.weight(kv_a_);
  blas::linear_forward(c.ctx, x, row_range(w_kv_a, 0, kv_lora_), a.c_kv);
  blas::linear_forward(c.ctx, x, row_range(w_kv_a, kv_lora_, rope_), k_pe);
  c.store(a.c_kv);
  kv_norm_.forward(c, a.c_kv, kv_norm);
  if (!cache) blas::linear_forward(c.ctx, kv_norm.out, c.weight(kv_b_), a.kv);
  const Rope r = rope.rows(p0, T);
  kernels::rope_interleaved_forward(c.ctx, a.q.reshaped({B, T, H_, qk}), r.cos, r.sin);
  kernels::rope_interleaved_forward(c.ctx, k_pe.reshaped({B, T, 1, rope_}), r.cos, r.sin);
  c.store(a.q);
  c.store(k_pe);
  if (cache) {
    cached_core(c, T, a, *cache);
  } else {
    c.store(a.kv);
    core_forward(c, B, T, a, true);
  }
  c.store(a.attn);
  blas::linear_forward(c.ctx, a.attn, c.weight(o_), out);
  c.reduce_partial(out);  // tensor parallelism: this rank's heads' share of the output
}

void LatentAttention::core_forward(const Compute& c, std::int64_t B, std::int64_t T,
                                   const LatentAttentionActs& a, bool heads_out) const {
  const std::int64_t H = H_, dn = nope_, dr = rope_, dv = v_;
  const std::int64_t QW = H * (dn + dr), KW = H * (dn + dv), AW = H * dv;  // row widths
  const kernels::AttentionGrouping g = kernels::attention_grouping(c.ctx);
  const std::int64_t seqs = g.one_head_at_a_time ? 1 : B;
  const std::int64_t block = g.query_block > 0 ? g.query_block : T;
  for (std::int64_t b0 = 0; b0 < B; b0 += seqs) {
    const float* q = a.q.ptr<float>() + b0 * T * QW;
    const float* kv = a.kv.ptr<float>() + b0 * T * KW;
    const float* kpe = a.k_pe.ptr<float>() + b0 * T * dr;
    float* p = a.probs.ptr<float>() + b0 * H * T * T;
    float* out = a.attn.ptr<float>() + b0 * T * AW;
    const std::int64_t heads = g.one_head_at_a_time ? 1 : H;
    for (std::int64_t h0 = 0; h0 < H; h0 += heads) {
      for (std::int64_t h = h0; h < h0 + heads; ++h)
        for (std::int64_t r0 = 0; r0 < T; r0 += block) {
          const std::int64_t r1 = std::min(T, r0 + block);
          // scores[b, h][r0:r1, 0:r1] = q_nope k_nope^T + q_pe k_pe^T
          float* sc = p + h * T * T + r0 * T;
          if (dn > 0)
            blas::small_gemm_strided_batched(
                c.ctx, Trans::no, Trans::yes, r1 - r0, r1, dn, q + r0 * QW + h * (dn + dr), QW,
                T * QW, kv + h * (dn + dv), KW, T * KW, false, sc, T, H * T * T, seqs);
          blas::small_gemm_strided_batched(c.ctx, Trans::no, Trans::yes, r1 - r0, r1, dr,
                                           q + r0 * QW + h * (dn + dr) + dn, QW, T * QW, kpe, dr,
                                           T * dr, dn > 0, sc, T, H * T * T, seqs);
        }
      Tensor probs = a.probs;
      probs.data = p + h0 * T * T;
      probs.shape = tensor::Shape{seqs, heads, T, T};
      kernels::causal_softmax_forward(c.ctx, probs, scale_, probs);
      c.store(probs);
      if (!heads_out) continue;
      for (std::int64_t h = h0; h < h0 + heads; ++h)
        for (std::int64_t r0 = 0; r0 < T; r0 += block) {
          const std::int64_t r1 = std::min(T, r0 + block);
          // attn[b, r0:r1, h, :] = probs[b, h][r0:r1, 0:r1] v[b, 0:r1, h, :]
          blas::small_gemm_strided_batched(
              c.ctx, Trans::no, Trans::no, r1 - r0, dv, r1, p + h * T * T + r0 * T, T, H * T * T,
              kv + h * (dn + dv) + dn, KW, T * KW, false, out + r0 * AW + h * dv, AW, T * AW, seqs);
        }
    }
  }
}

void LatentAttention::cached_core(const Compute& c, std::int64_t T, const LatentAttentionActs& a,
                                  const LatentKVCache& cache) const {
  const std::int64_t H = H_, dn = nope_, dr = rope_, dv = v_, R = kv_lora_;
  const std::int64_t QW = H * (dn + dr), AW = H * dv;
  const std::int64_t p0 = cache.position;
  const std::int64_t len = p0 + T;                     // positions the new rows attend to
  const float* latent = cache.latent.ptr<float>();     // (len, R)
  const float* kpe = cache.k_pe.ptr<float>();          // (len, dr)
  const float* w_kv_b = c.weight(kv_b_).ptr<float>();  // (H*(dn+dv), R): per head [W_UK; W_UV]
  float* q_lat = cache.q_lat.ptr<float>();
  float* o_lat = cache.o_lat.ptr<float>();
  float* sc = cache.scores.ptr<float>();
  for (std::int64_t h = 0; h < H; ++h) {
    const float* q_h = a.q.ptr<float>() + h * (dn + dr);
    const float* w_uk = w_kv_b + h * (dn + dv) * R;  // (dn, R)
    const float* w_uv = w_uk + dn * R;               // (dv, R)
    // scores (T, len) = (q_nope W_UK) latent^T + q_pe k_pe^T
    if (dn > 0) {
      blas::gemm(c.ctx, Trans::no, Trans::no, T, R, dn, 1.0f, q_h, QW, w_uk, R, 0.0f, q_lat, R);
      blas::gemm(c.ctx, Trans::no, Trans::yes, T, len, R, 1.0f, q_lat, R, latent, R, 0.0f, sc, len);
    }
    blas::gemm(c.ctx, Trans::no, Trans::yes, T, len, dr, 1.0f, q_h + dn, QW, kpe, dr,
               dn > 0 ? 1.0f : 0.0f, sc, len);
    offset_causal_softmax(sc, T, p0, len, scale_);
    // attn[:, h, :] (T, dv) = (probs latent) W_UV^T
    blas::gemm(c.ctx, Trans::no, Trans::no, T, R, len, 1.0f, sc, len, latent, R, 0.0f, o_lat, R);
    blas::gemm(c.ctx, Trans::no, Trans::yes, T, dv, R, 1.0f, o_lat, R, w_uv, R, 0.0f,
               a.attn.ptr<float>() + h * dv, AW);
  }
}

void LatentAttention::backward(const Compute& c, const Rope& rope, std::int64_t B, std::int64_t T,
                               const Tensor& dout, const Tensor& x, const LatentAttentionActs& a,
                               const LatentAttentionScratch& s, const Tensor& dx) const {
  const std::int64_t qk = nope_ + rope_;
  c.store(dout);
  blas::linear_backward(c.ctx, dout, a.attn, c.weight(o_), s.d_attn, c.grad(o_));
  c.store(s.d_attn);
  core_backward(c, B, T, a, s);
  const Rope r = rope.rows(0, T);
  kernels::rope_interleaved_backward(c.ctx, s.d_q.reshaped({B, T, H_, qk}), r.cos, r.sin);
  kernels::rope_interleaved_backward(c.ctx, s.d_k_pe.reshaped({B, T, 1, rope_}), r.cos, r.sin);
  c.store(s.d_q);
  c.store(s.d_kv);
  c.store(s.d_k_pe);
  // Keys and values: kv_b_proj, the latent's norm, kv_a_proj_with_mqa's two row blocks.
  blas::linear_backward(c.ctx, s.d_kv, a.kv_norm.out, c.weight(kv_b_), s.d_kv_n, c.grad(kv_b_));
  // Tensor parallelism: the latents' gradients are this rank's heads' shares until summed
  // over the group (the file comment); their input gradient is then whole on every rank,
  // and only the group's first rank adds it to dx (`whole_dx`), which the group sums.
  c.reduce_replicated(s.d_kv_n);
  c.reduce_replicated(s.d_k_pe);
  const bool whole_dx = tp_ == 1 || c.tensor_rank() == 0;
  const Tensor none;
  bool written = false;  // dx is written by its first product, accumulated by the others
  const auto into_dx = [&](bool whole) -> const Tensor& { return whole && !whole_dx ? none : dx; };
  const auto accumulate = [&](bool whole) {
    const bool was = written;
    written = written || !whole || whole_dx;
    return was;
  };
  kernels::zero(c.ctx, s.d_c_kv);  // the norm's backward accumulates
  kv_norm_.backward(c, s.d_kv_n, a.c_kv, a.kv_norm, s.d_c_kv);
  c.store(s.d_c_kv);
  const Tensor w_kv_a = c.weight(kv_a_), g_kv_a = c.grad(kv_a_);
  blas::linear_backward(c.ctx, s.d_c_kv, x, row_range(w_kv_a, 0, kv_lora_), into_dx(true),
                        row_range(g_kv_a, 0, kv_lora_), accumulate(true));
  blas::linear_backward(c.ctx, s.d_k_pe, x, row_range(w_kv_a, kv_lora_, rope_), into_dx(true),
                        row_range(g_kv_a, kv_lora_, rope_), accumulate(true));
  // Queries.
  if (q_lora_ > 0) {
    blas::linear_backward(c.ctx, s.d_q, a.q_norm.out, c.weight(q_b_), s.d_q_n, c.grad(q_b_));
    c.reduce_replicated(s.d_q_n);
    kernels::zero(c.ctx, s.d_q_a);
    q_norm_.backward(c, s.d_q_n, a.q_a, a.q_norm, s.d_q_a);
    c.store(s.d_q_a);
    blas::linear_backward(c.ctx, s.d_q_a, x, c.weight(q_a_), into_dx(true), c.grad(q_a_),
                          accumulate(true));
  } else {
    blas::linear_backward(c.ctx, s.d_q, x, c.weight(q_), dx, c.grad(q_), accumulate(false));
  }
  if (!written) kernels::zero(c.ctx, dx);  // a rank whose heads' share of dx is nothing
  c.reduce_partial(dx);  // tensor parallelism: the heads' shares, the latents' once
}

void LatentAttention::core_backward(const Compute& c, std::int64_t B, std::int64_t T,
                                    const LatentAttentionActs& a,
                                    const LatentAttentionScratch& s) const {
  const std::int64_t H = H_, dn = nope_, dr = rope_, dv = v_;
  const std::int64_t QW = H * (dn + dr), KW = H * (dn + dv), AW = H * dv;
  const kernels::AttentionGrouping g = kernels::attention_grouping(c.ctx);
  const std::int64_t seqs = g.one_head_at_a_time ? 1 : B;
  const std::int64_t heads = g.one_head_at_a_time ? 1 : H;
  const std::int64_t block = g.query_block > 0 ? g.query_block : T;
  // Heads share k_pe, query blocks share keys and values: their gradients add up.
  kernels::zero(c.ctx, s.d_kv);
  kernels::zero(c.ctx, s.d_k_pe);
  for (std::int64_t b0 = 0; b0 < B; b0 += seqs) {
    const float* q = a.q.ptr<float>() + b0 * T * QW;
    const float* kv = a.kv.ptr<float>() + b0 * T * KW;
    const float* kpe = a.k_pe.ptr<float>() + b0 * T * dr;
    const float* p = a.probs.ptr<float>() + b0 * H * T * T;
    const float* da = s.d_attn.ptr<float>() + b0 * T * AW;
    float* dq = s.d_q.ptr<float>() + b0 * T * QW;
    float* dkv = s.d_kv.ptr<float>() + b0 * T * KW;
    float* dkpe = s.d_k_pe.ptr<float>() + b0 * T * dr;
    for (std::int64_t h0 = 0; h0 < H; h0 += heads) {
      // The group's score gradients: one (T, T) slice reused per (sequence, head) on a
      // host core (it stays in cache), the whole (B, H, T, T) for one group on a GPU.
      Tensor dprobs = s.d_probs;
      dprobs.data = s.d_probs.ptr<float>() + (g.one_head_at_a_time ? 0 : (b0 * H + h0) * T * T);
      dprobs.shape = tensor::Shape{seqs, heads, T, T};
      auto dp = [&](std::int64_t h) { return dprobs.ptr<float>() + (h - h0) * T * T; };
      for (std::int64_t h = h0; h < h0 + heads; ++h)
        for (std::int64_t r0 = 0; r0 < T; r0 += block) {
          const std::int64_t r1 = std::min(T, r0 + block);
          // d_probs = d_attn v^T;  d_v += probs^T d_attn
          blas::small_gemm_strided_batched(
              c.ctx, Trans::no, Trans::yes, r1 - r0, r1, dv, da + r0 * AW + h * dv, AW, T * AW,
              kv + h * (dn + dv) + dn, KW, T * KW, false, dp(h) + r0 * T, T, H * T * T, seqs);
          blas::small_gemm_strided_batched(
              c.ctx, Trans::yes, Trans::no, r1, dv, r1 - r0, p + h * T * T + r0 * T, T, H * T * T,
              da + r0 * AW + h * dv, AW, T * AW, true, dkv + h * (dn + dv) + dn, KW, T * KW, seqs);
        }
      Tensor probs = a.probs;
      probs.data = const_cast<float*>(p) + h0 * T * T;
      probs.shape = tensor::Shape{seqs, heads, T, T};
      kernels::causal_softmax_backward(c.ctx, probs, dprobs, scale_, dprobs);  // -> d_scores
      for (std::int64_t h = h0; h < h0 + heads; ++h)
        for (std::int64_t r0 = 0; r0 < T; r0 += block) {
          const std::int64_t r1 = std::min(T, r0 + block);
          const float* ds = dp(h) + r0 * T;
          float* dq_h = dq + r0 * QW + h * (dn + dr);
          const float* q_h = q + r0 * QW + h * (dn + dr);
          if (dn > 0) {
            // d_q_nope = d_scores k_nope;  d_k_nope += d_scores^T q_nope
            blas::small_gemm_strided_batched(c.ctx, Trans::no, Trans::no, r1 - r0, dn, r1, ds, T,
                                             H * T * T, kv + h * (dn + dv), KW, T * KW, false, dq_h,
                                             QW, T * QW, seqs);
            blas::small_gemm_strided_batched(c.ctx, Trans::yes, Trans::no, r1, dn, r1 - r0, ds, T,
                                             H * T * T, q_h, QW, T * QW, true, dkv + h * (dn + dv),
                                             KW, T * KW, seqs);
          }
          // d_q_pe = d_scores k_pe;  d_k_pe += d_scores^T q_pe (summed over heads)
          blas::small_gemm_strided_batched(c.ctx, Trans::no, Trans::no, r1 - r0, dr, r1, ds, T,
                                           H * T * T, kpe, dr, T * dr, false, dq_h + dn, QW, T * QW,
                                           seqs);
          blas::small_gemm_strided_batched(c.ctx, Trans::yes, Trans::no, r1, dr, r1 - r0, ds, T,
                                           H * T * T, q_h + dn, QW, T * QW, true, dkpe, dr, T * dr,
                                           seqs);
        }
    }
  }
}

}  // namespace dst::model
