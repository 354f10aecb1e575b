#include "model/layers/attention.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "blas/gemm.hpp"
#include "core/error.hpp"
#include "kernels/kernels.hpp"
#include "model/layers/yarn.hpp"
#include "tensor/memory.hpp"

namespace dst::model {

namespace {
using blas::Trans;
using tensor::Shape;
using tensor::Tensor;

/// The (sequence, head) groups and query blocks an unfused attention over B sequences of
/// T tokens and H heads runs in (kernels::AttentionGrouping: the back end's choice).
struct Groups {
  kernels::AttentionGrouping grouping;
  std::int64_t B, T, H;

  /// body(b0, seqs, h0, heads) for each group of sequences [b0, b0 + seqs) and heads
  /// [h0, h0 + heads).
  template <class Body>
  void for_head_groups(Body body) const {
    const std::int64_t seqs = grouping.one_head_at_a_time ? 1 : B;
    const std::int64_t heads = grouping.one_head_at_a_time ? 1 : H;
    for (std::int64_t b0 = 0; b0 < B; b0 += seqs)
      for (std::int64_t h0 = 0; h0 < H; h0 += heads)
        body(b0, seqs, h0, heads);
  }

  /// body(r0, r1) for each block [r0, r1) of query rows.
  template <class Body>
  void for_query_blocks(Body body) const {
    const std::int64_t block = grouping.query_block > 0 ? grouping.query_block : T;
    for (std::int64_t r0 = 0; r0 < T; r0 += block)
      body(r0, std::min(T, r0 + block));
  }

  /// probs-shaped (B, H, T, T) rows of sequences [b0, b0 + seqs) and heads [h0, h0 + heads):
  /// contiguous because a group is either one head of one sequence or all of them.
  Tensor head_slice(const Tensor& t, std::int64_t b0, std::int64_t seqs, std::int64_t h0,
                    std::int64_t heads) const {
    Tensor v = t;
    v.data = t.ptr<float>() + (b0 * H + h0) * T * T;
    v.shape = Shape{seqs, heads, T, T};
    return v;
  }
};

/// a.probs of the group's sequences [b0, b0 + seqs) and heads [h0, h0 + heads) from a.q
/// and a.k: the scores, their causal softmax, rounded to the storage type. The forward and
/// the selective recompute both call it, so both write the same bits.
void causal_probabilities(const Compute& c, const Groups& groups, const AttentionActs& a,
                          std::int64_t KV, std::int64_t D, float scale, std::int64_t b0,
                          std::int64_t seqs, std::int64_t h0, std::int64_t heads) {
  const std::int64_t T = groups.T, H = groups.H;
  const std::int64_t group = H / KV;  // query heads per key/value head
  const float* q = a.q.ptr<float>() + b0 * T * H * D;
  const float* k = a.k.ptr<float>() + b0 * T * KV * D;
  float* p = a.probs.ptr<float>() + b0 * H * T * T;
  // One batched product per head and query block over the group's sequences:
  // scores[b, h][r0:r1, 0:r1] = q[b, r0:r1, h, :] (r1-r0, D) x k[b, 0:r1, h / group, :]^T.
  // Rows of q are H*D apart; rows of scores T apart.
  for (std::int64_t h = h0; h < h0 + heads; ++h) {
    const std::int64_t kh = h / group;
    groups.for_query_blocks([&](std::int64_t r0, std::int64_t r1) {
      blas::small_gemm_strided_batched(
          c.ctx, Trans::no, Trans::yes, r1 - r0, r1, D, q + r0 * H * D + h * D, H * D, T * H * D,
          k + kh * D, KV * D, T * KV * D, false, p + h * T * T + r0 * T, T, H * T * T, seqs);
    });
  }
  const Tensor probs = groups.head_slice(a.probs, b0, seqs, h0, heads);
  kernels::causal_softmax_forward(c.ctx, probs, scale, probs);
  c.store(probs);  // softmax in fp32; the probabilities are stored for P x V
}
}  // namespace

void offset_causal_softmax(float* scores, std::int64_t n, std::int64_t p0, std::int64_t len,
                           float scale) {
  for (std::int64_t i = 0; i < n; ++i) {
    float* r = scores + i * len;
    const std::int64_t live = p0 + i + 1;
    float m = scale * r[0];
    for (std::int64_t j = 1; j < live; ++j)
      m = std::max(m, scale * r[j]);
    double sum = 0.0;
    for (std::int64_t j = 0; j < live; ++j) {
      r[j] = std::exp(scale * r[j] - m);
      sum += static_cast<double>(r[j]);
    }
    const float inv = static_cast<float>(1.0 / sum);  // sum >= 1: the max's own term
    for (std::int64_t j = 0; j < live; ++j)
      r[j] *= inv;
    for (std::int64_t j = live; j < len; ++j)
      r[j] = 0.0f;
  }
}

// --- RoPE tables -------------------------------------------------------------------------

Rope Rope::take(tensor::Arena& arena, std::int64_t positions, std::int64_t head_dim) {
  Rope r;
  r.cos = arena.take("rope_cos", {positions, head_dim / 2}, DType::f32);
  r.sin = arena.take("rope_sin", {positions, head_dim / 2}, DType::f32);
  return r;
}

void Rope::fill(const tensor::ExecContext& ctx, double theta,
                const config::RopeScalingSection& scaling) const {
  if (scaling.type == config::RopeScalingType::none) {
    kernels::rope_tables(ctx, theta, cos, sin);
    return;
  }
  const std::int64_t positions = cos.shape[0], half = cos.shape[1];
  const std::vector<double> inv = yarn::inv_freq(2 * half, theta, scaling);
  const double f = yarn::table_factor(scaling);
  std::vector<float> c(static_cast<std::size_t>(positions * half)), s(c.size());
  for (std::int64_t t = 0; t < positions; ++t)
    for (std::int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(t) * inv[static_cast<std::size_t>(i)];
      c[static_cast<std::size_t>(t * half + i)] = static_cast<float>(f * std::cos(angle));
      s[static_cast<std::size_t>(t * half + i)] = static_cast<float>(f * std::sin(angle));
    }
  tensor::copy(ctx, cos.data, c.data(), c.size() * sizeof(float));
  tensor::copy(ctx, sin.data, s.data(), s.size() * sizeof(float));
}

Rope Rope::rows(std::int64_t first, std::int64_t n) const {
  return Rope{row_range(cos, first, n), row_range(sin, first, n)};
}

// --- the layer ---------------------------------------------------------------------------

Attention::Attention(std::string prefix, std::int64_t dim, std::int64_t heads,
                     std::int64_t kv_heads, float out_std, int tensor_parallel)
    : prefix_(std::move(prefix)),
      C_(dim),
      H_(heads / tensor_parallel),
      KV_(std::max<std::int64_t>(1, kv_heads / tensor_parallel)),
      D_(dim / heads),
      out_std_(out_std),
      scale_(1.0f / std::sqrt(static_cast<float>(dim / heads))),
      kv_replicas_(kv_heads < tensor_parallel ? static_cast<int>(tensor_parallel / kv_heads) : 1) {
  if (heads % tensor_parallel != 0 ||
      (kv_heads % tensor_parallel != 0 && tensor_parallel % kv_heads != 0))
    throw Error("model: tensor parallelism over " + std::to_string(tensor_parallel) +
                " ranks does not split " + std::to_string(heads) + " query heads and " +
                std::to_string(kv_heads) + " key/value heads evenly");
}

void Attention::declare(std::vector<ParamSpec>& specs) const {
  const std::int64_t Q = H_ * D_, KV = KV_ * D_;
  add_param(specs, prefix_ + "q_proj.weight", {Q, C_}, Init::normal, kInitStd, true, Split::column);
  add_param(specs, prefix_ + "k_proj.weight", {KV, C_}, Init::normal, kInitStd, true,
            Split::column);
  specs.back().tp_replicas = kv_replicas_;
  add_param(specs, prefix_ + "v_proj.weight", {KV, C_}, Init::normal, kInitStd, true,
            Split::column);
  specs.back().tp_replicas = kv_replicas_;
  add_param(specs, prefix_ + "o_proj.weight", {C_, Q}, Init::normal, out_std_, true, Split::row);
}

void Attention::bind(const ParamStore& params) {
  q_ = params.index_of(prefix_ + "q_proj.weight");
  k_ = params.index_of(prefix_ + "k_proj.weight");
  v_ = params.index_of(prefix_ + "v_proj.weight");
  o_ = params.index_of(prefix_ + "o_proj.weight");
}

void Attention::take_qkv(tensor::Arena& arena, const std::string& prefix, std::int64_t N, Tensor& q,
                         Tensor& k, Tensor& v) const {
  q = arena.take(prefix + "q", {N, H_ * D_}, DType::f32);
  k = arena.take(prefix + "k", {N, KV_ * D_}, DType::f32);
  v = arena.take(prefix + "v", {N, KV_ * D_}, DType::f32);
}

AttentionActs Attention::take(tensor::Arena& arena, std::int64_t B, std::int64_t T, bool fused,
                              bool keep_probs) const {
  const std::int64_t N = B * T;
  AttentionActs a;
  take_qkv(arena, "", N, a.q, a.k, a.v);
  if (fused)
    a.stats = arena.take("attn_stats", {B, H_, T}, DType::f32);
  else if (keep_probs)
    a.probs = take_probs(arena, B, T);
  a.attn = arena.take("attn", {N, H_ * D_}, DType::f32);
  a.fused = fused;
  return a;
}

Tensor Attention::take_probs(tensor::Arena& arena, std::int64_t B, std::int64_t T) const {
  return arena.take("probs", {B, H_, T, T}, DType::f32);
}

AttentionScratch Attention::take_scratch(tensor::Arena& arena, std::int64_t B, std::int64_t T,
                                         bool fused) const {
  const std::int64_t N = B * T;
  AttentionScratch s;
  take_qkv(arena, "d_", N, s.d_q, s.d_k, s.d_v);
  if (!fused) s.d_probs = arena.take("d_probs", {B, H_, T, T}, DType::f32);
  s.d_attn = arena.take("d_attn", {N, H_ * D_}, DType::f32);
  return s;
}

void Attention::forward(const Compute& c, const Rope& rope, std::int64_t B, std::int64_t T,
                        const Tensor& x, const AttentionActs& a, const Tensor& out,
                        const KVCache* cache) const {
  const std::int64_t p0 = cache ? cache->position : 0;
  const Tensor k = cache ? row_range(cache->k, p0, T) : a.k;  // (N, KV*D) this call's rows
  const Tensor v = cache ? row_range(cache->v, p0, T) : a.v;
  const Rope r = rope.rows(p0, T);
  blas::linear_forward(c.ctx, x, c.weight(q_), a.q);
  blas::linear_forward(c.ctx, x, c.weight(k_), k);
  blas::linear_forward(c.ctx, x, c.weight(v_), v);
  kernels::rope_forward(c.ctx, a.q.reshaped({B, T, H_, D_}), r.cos, r.sin);
  kernels::rope_forward(c.ctx, k.reshaped({B, T, KV_, D_}), r.cos, r.sin);
  c.store(a.q);
  c.store(k);
  c.store(v);
  if (cache)
    cached_forward(c, T, a, *cache);
  else if (a.fused)
    kernels::fused_attention_forward(c.ctx, a.q.reshaped({B, T, H_, D_}),
                                     a.k.reshaped({B, T, KV_, D_}), a.v.reshaped({B, T, KV_, D_}),
                                     scale_, a.attn.reshaped({B, T, H_, D_}), a.stats);
  else
    unfused_forward(c, B, T, a);
  c.store(a.attn);
  blas::linear_forward(c.ctx, a.attn, c.weight(o_), out);
  c.reduce_partial(out);  // tensor parallelism: this rank's heads' share of the output
}

void Attention::unfused_forward(const Compute& c, std::int64_t B, std::int64_t T,
                                const AttentionActs& a) const {
  const std::int64_t H = H_, KV = KV_, D = D_;
  const Groups groups{kernels::attention_grouping(c.ctx), B, T, H};
  const std::int64_t group = H / KV;  // query heads per key/value head
  groups.for_head_groups(
      [&](std::int64_t b0, std::int64_t seqs, std::int64_t h0, std::int64_t heads) {
        causal_probabilities(c, groups, a, KV_, D_, scale_, b0, seqs, h0, heads);
        const float* v = a.v.ptr<float>() + b0 * T * KV * D;
        const float* p = a.probs.ptr<float>() + b0 * H * T * T;
        float* out = a.attn.ptr<float>() + b0 * T * H * D;
        for (std::int64_t h = h0; h < h0 + heads; ++h) {
          const std::int64_t kh = h / group;
          // out[b, r0:r1, h, :] (r1-r0, D) = probs[b, h][r0:r1, 0:r1] x v[b, 0:r1, kh, :]
          groups.for_query_blocks([&](std::int64_t r0, std::int64_t r1) {
            blas::small_gemm_strided_batched(c.ctx, Trans::no, Trans::no, r1 - r0, D, r1,
                                             p + h * T * T + r0 * T, T, H * T * T, v + kh * D,
                                             KV * D, T * KV * D, false, out + r0 * H * D + h * D,
                                             H * D, T * H * D, seqs);
          });
        }
      });
}

void Attention::recompute_probs(const Compute& c, std::int64_t B, std::int64_t T,
                                const AttentionActs& a) const {
  if (a.fused) return;  // the fused backward recomputes them itself, from the statistics
  const Groups groups{kernels::attention_grouping(c.ctx), B, T, H_};
  groups.for_head_groups(
      [&](std::int64_t b0, std::int64_t seqs, std::int64_t h0, std::int64_t heads) {
        causal_probabilities(c, groups, a, KV_, D_, scale_, b0, seqs, h0, heads);
      });
}

void Attention::cached_forward(const Compute& c, std::int64_t T, const AttentionActs& a,
                               const KVCache& cache) const {
  const std::int64_t H = H_, KV = KV_, D = D_;
  const std::int64_t p0 = cache.position;
  const std::int64_t len = p0 + T;         // keys the new rows attend to
  const std::int64_t group = H / KV;       // query heads per key/value head
  const float* kl = cache.k.ptr<float>();  // (len, KV*D) cached keys
  const float* vl = cache.v.ptr<float>();
  float* sc = a.probs.ptr<float>();
  for (std::int64_t h = 0; h < H; ++h) {
    const std::int64_t kh = h / group;
    // scores (T, len) = q[:, h, :] (T, D) x k[:len, kh, :]^T
    blas::gemm(c.ctx, Trans::no, Trans::yes, T, len, D, 1.0f, a.q.ptr<float>() + h * D, H * D,
               kl + kh * D, KV * D, 0.0f, sc, len);
    offset_causal_softmax(sc, T, p0, len, scale_);
    // attn[:, h, :] (T, D) = probs (T, len) x v[:len, kh, :] (len, D)
    blas::gemm(c.ctx, Trans::no, Trans::no, T, D, len, 1.0f, sc, len, vl + kh * D, KV * D, 0.0f,
               a.attn.ptr<float>() + h * D, H * D);
  }
}

void Attention::backward(const Compute& c, const Rope& rope, std::int64_t B, std::int64_t T,
                         const Tensor& dout, const Tensor& x, const AttentionActs& a,
                         const AttentionScratch& s, const Tensor& dx) const {
  c.store(dout);
  blas::linear_backward(c.ctx, dout, a.attn, c.weight(o_), s.d_attn, c.grad(o_));
  c.store(s.d_attn);
  if (a.fused)
    kernels::fused_attention_backward(
        c.ctx, a.q.reshaped({B, T, H_, D_}), a.k.reshaped({B, T, KV_, D_}),
        a.v.reshaped({B, T, KV_, D_}), a.attn.reshaped({B, T, H_, D_}),
        s.d_attn.reshaped({B, T, H_, D_}), a.stats, scale_, s.d_q.reshaped({B, T, H_, D_}),
        s.d_k.reshaped({B, T, KV_, D_}), s.d_v.reshaped({B, T, KV_, D_}));
  else
    unfused_backward(c, B, T, a, s);
  kernels::rope_backward(c.ctx, s.d_q.reshaped({B, T, H_, D_}), rope.cos, rope.sin);
  kernels::rope_backward(c.ctx, s.d_k.reshaped({B, T, KV_, D_}), rope.cos, rope.sin);
  c.store(s.d_q);
  c.store(s.d_k);
  c.store(s.d_v);
  blas::linear_backward(c.ctx, s.d_q, x, c.weight(q_), dx, c.grad(q_));
  if (kv_replicas_ == 1) {
    blas::linear_backward(c.ctx, s.d_k, x, c.weight(k_), dx, c.grad(k_), true);
    blas::linear_backward(c.ctx, s.d_v, x, c.weight(v_), dx, c.grad(v_), true);
  } else {
    // A key/value head shared by kv_replicas_ ranks: d_k, d_v here are the share of this
    // rank's query heads. The input gradient takes that share (the tensor all-reduce below
    // sums the shares); the weight gradient needs the whole, so d_k and d_v are summed
    // over the ranks sharing the head first. Summing these activation gradients, rather
    // than the weight gradients after the backward, keeps the replicas' gradients equal
    // (the same bits) from the start, so gradient accumulation, the data-parallel buckets
    // and ZeRO see ordinary gradients; it moves 2 x N x D floats per layer and
    // micro-batch instead of 2 x D x C per step (plan.cpp counts them).
    const Tensor none;
    blas::linear_backward(c.ctx, s.d_k, x, c.weight(k_), dx, none, true);
    blas::linear_backward(c.ctx, s.d_v, x, c.weight(v_), dx, none, true);
    c.reduce_kv_replicas(s.d_k);
    c.reduce_kv_replicas(s.d_v);
    c.store(s.d_k);
    c.store(s.d_v);
    blas::linear_backward(c.ctx, s.d_k, x, c.weight(k_), none, c.grad(k_));
    blas::linear_backward(c.ctx, s.d_v, x, c.weight(v_), none, c.grad(v_));
  }
  c.reduce_partial(dx);  // tensor parallelism: this rank's heads' share of the gradient
}

void Attention::unfused_backward(const Compute& c, std::int64_t B, std::int64_t T,
                                 const AttentionActs& a, const AttentionScratch& s) const {
  const std::int64_t H = H_, KV = KV_, D = D_;
  const Groups groups{kernels::attention_grouping(c.ctx), B, T, H};
  const std::int64_t group = H / KV;
  // Query heads sharing a key/value head, and query blocks, add into its gradient.
  kernels::zero(c.ctx, s.d_k);
  kernels::zero(c.ctx, s.d_v);
  groups.for_head_groups([&](std::int64_t b0, std::int64_t seqs, std::int64_t h0,
                             std::int64_t heads) {
    const float* q = a.q.ptr<float>() + b0 * T * H * D;
    const float* k = a.k.ptr<float>() + b0 * T * KV * D;
    const float* v = a.v.ptr<float>() + b0 * T * KV * D;
    const float* p = a.probs.ptr<float>() + b0 * H * T * T;
    const float* da = s.d_attn.ptr<float>() + b0 * T * H * D;
    float* dq = s.d_q.ptr<float>() + b0 * T * H * D;
    float* dk = s.d_k.ptr<float>() + b0 * T * KV * D;
    float* dv = s.d_v.ptr<float>() + b0 * T * KV * D;
    // The group's score gradients: one (T, T) slice reused per (sequence, head) on a
    // host core, so it stays in cache; d_probs keeps the whole (B, H, T, T) a GPU uses.
    const Tensor dprobs = groups.grouping.one_head_at_a_time
                              ? groups.head_slice(s.d_probs, 0, 1, 0, 1)
                              : groups.head_slice(s.d_probs, b0, seqs, h0, heads);
    // Head h's (T, T) score gradients (the sequences' batch stride is H x T x T).
    auto dp = [&](std::int64_t h) { return dprobs.ptr<float>() + (h - h0) * T * T; };
    for (std::int64_t h = h0; h < h0 + heads; ++h) {
      const std::int64_t kh = h / group;
      groups.for_query_blocks([&](std::int64_t r0, std::int64_t r1) {
        // d_probs[b, h][r0:r1, 0:r1] = d_attn[b, r0:r1, h, :] (r1-r0, D) x v[b, 0:r1, kh, :]^T
        blas::small_gemm_strided_batched(
            c.ctx, Trans::no, Trans::yes, r1 - r0, r1, D, da + r0 * H * D + h * D, H * D, T * H * D,
            v + kh * D, KV * D, T * KV * D, false, dp(h) + r0 * T, T, H * T * T, seqs);
        // d_v[b, 0:r1, kh, :] (r1, D) += probs[b, h][r0:r1, 0:r1]^T x d_attn[b, r0:r1, h, :]
        blas::small_gemm_strided_batched(
            c.ctx, Trans::yes, Trans::no, r1, D, r1 - r0, p + h * T * T + r0 * T, T, H * T * T,
            da + r0 * H * D + h * D, H * D, T * H * D, true, dv + kh * D, KV * D, T * KV * D, seqs);
      });
    }
    kernels::causal_softmax_backward(c.ctx, groups.head_slice(a.probs, b0, seqs, h0, heads), dprobs,
                                     scale_, dprobs);  // -> d_scores
    for (std::int64_t h = h0; h < h0 + heads; ++h) {
      const std::int64_t kh = h / group;
      groups.for_query_blocks([&](std::int64_t r0, std::int64_t r1) {
        // d_q[b, r0:r1, h, :] (r1-r0, D) = d_scores[b, h][r0:r1, 0:r1] x k[b, 0:r1, kh, :]
        blas::small_gemm_strided_batched(
            c.ctx, Trans::no, Trans::no, r1 - r0, D, r1, dp(h) + r0 * T, T, H * T * T, k + kh * D,
            KV * D, T * KV * D, false, dq + r0 * H * D + h * D, H * D, T * H * D, seqs);
        // d_k[b, 0:r1, kh, :] (r1, D) += d_scores[b, h][r0:r1, 0:r1]^T x q[b, r0:r1, h, :]
        blas::small_gemm_strided_batched(
            c.ctx, Trans::yes, Trans::no, r1, D, r1 - r0, dp(h) + r0 * T, T, H * T * T,
            q + r0 * H * D + h * D, H * D, T * H * D, true, dk + kh * D, KV * D, T * KV * D, seqs);
      });
    }
  });
}

}  // namespace dst::model
