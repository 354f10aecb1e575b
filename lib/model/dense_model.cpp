#include "model/dense_model.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "blas/gemm.hpp"
#include "core/error.hpp"
#include "kernels/kernels.hpp"
#include "tensor/memory.hpp"

namespace dst::model {

namespace {
using blas::Trans;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
using tensor::Arena;
using tensor::Shape;
using tensor::Tensor;

/// Parameter indices of one block.
struct BlockParams {
  std::size_t ln1, q, k, v, o, ln2, gate, up, down;
};

/// What one block keeps from forward for backward.  N = B*T.
struct BlockActs {
  Tensor x;      // (N, C)   block input (residual stream)
  Tensor ln1;    // (N, C)   rmsnorm(x)
  Tensor rstd1;  // (N)
  Tensor q;      // (N, H*D) after RoPE
  Tensor k;      // (N, KV*D) after RoPE
  Tensor v;      // (N, KV*D)
  Tensor probs;  // (B, H, T, T) attention probabilities (unfused attention)
  Tensor stats;  // (B, H, T)    softmax log-sum-exp rows (fused attention)
  Tensor attn;   // (N, H*D) attention output, before o_proj
  Tensor mid;    // (N, C)   x + o_proj(attn)
  Tensor ln2;    // (N, C)   rmsnorm(mid)
  Tensor rstd2;  // (N)
  Tensor h1;     // (N, F)   gate_proj(ln2)
  Tensor h3;     // (N, F)   up_proj(ln2)
  Tensor g;      // (N, F)   silu(h1) * h3
};
}  // namespace

struct DenseModel::Impl {
  config::ModelSection m;
  tensor::ExecContext ctx;
  std::int64_t B, T, N, C, H, KV, D, F, V, L;
  float eps, scale;
  Arena acts{"activations", Arena::Mode::plan};
  Arena work{"workspace", Arena::Mode::plan};
  // Emulated 16-bit storage (docs/precision.md): f32 = none. For bf16/f16 the compute
  // copy holds the master parameters rounded to the storage type, in the ParamStore's
  // layout; the forward and backward read their weights from it.
  DType storage = DType::f32;
  // Fused attention (cuDNN SDPA, kernels::fused_attention_*): where the back end supports
  // the shape and the run need not be bitwise deterministic. It keeps (B, H, T) softmax
  // statistics instead of the (B, H, T, T) probabilities and their gradient.
  bool fused = false;
  Arena compute{"compute parameters", Arena::Mode::plan};
  float* compute_base = nullptr;  // (buffer_elements), nullptr for f32

  std::size_t wte = 0, norm = 0, head = 0;
  std::vector<BlockParams> blocks;

  std::vector<BlockActs> layer;
  Tensor tokens, targets;  // (N) i32
  Tensor final_x;          // (N, C) output of the last block
  Tensor lnf, rstdf;       // (N, C), (N)
  Tensor logits;           // (N, V); becomes dlogits in forward_backward
  Tensor losses;           // (N)
  Tensor cos, sin;         // (T, D/2) RoPE tables
  // backward scratch, shared by all layers
  Tensor d_x;            // (N, C) gradient of the residual stream
  Tensor d_ln;           // (N, C)
  Tensor d_q, d_k, d_v;  // (N, H*D), (N, KV*D), (N, KV*D)
  Tensor d_probs;        // (B, H, T, T)
  Tensor d_attn;         // (N, H*D)
  Tensor d_g;            // (N, F); d_h1 and d_h3 overwrite the layer's h1 and h3
  double forward_s = 0.0, backward_s = 0.0;
  std::vector<float> host_losses;  // per-token losses of a device, copied to the host

  /// The weights the forward and backward compute with: the master parameter (f32), or
  /// its rounded compute copy (bf16/f16).
  Tensor weight(const ParamStore& ps, std::size_t i) const {
    Tensor t = ps.param(i);
    if (compute_base) t.data = compute_base + ps.spec(i).offset;
    return t;
  }
  /// Where a 16-bit back end would store `t` (an activation, or an activation's gradient
  /// that feeds a matrix product): round it to the storage type. Nothing for f32. The
  /// one place the model's emulated precision is applied to activations.
  void store(const Tensor& t) const {
    if (storage != DType::f32) kernels::round_to_storage(ctx, t, storage);
  }

  void take_all() {
    const auto f32 = DType::f32;
    tokens = acts.take("tokens", {N}, DType::i32);
    targets = acts.take("targets", {N}, DType::i32);
    layer.assign(static_cast<std::size_t>(L), BlockActs{});
    for (auto& a : layer) {
      a.x = acts.take("x", {N, C}, f32);
      a.ln1 = acts.take("ln1", {N, C}, f32);
      a.rstd1 = acts.take("rstd1", {N}, f32);
      a.q = acts.take("q", {N, H * D}, f32);
      a.k = acts.take("k", {N, KV * D}, f32);
      a.v = acts.take("v", {N, KV * D}, f32);
      if (fused)
        a.stats = acts.take("attn_stats", {B, H, T}, f32);
      else
        a.probs = acts.take("probs", {B, H, T, T}, f32);
      a.attn = acts.take("attn", {N, H * D}, f32);
      a.mid = acts.take("mid", {N, C}, f32);
      a.ln2 = acts.take("ln2", {N, C}, f32);
      a.rstd2 = acts.take("rstd2", {N}, f32);
      a.h1 = acts.take("h1", {N, F}, f32);
      a.h3 = acts.take("h3", {N, F}, f32);
      a.g = acts.take("g", {N, F}, f32);
    }
    final_x = acts.take("final_x", {N, C}, f32);
    lnf = acts.take("lnf", {N, C}, f32);
    rstdf = acts.take("rstdf", {N}, f32);
    logits = acts.take("logits", {N, V}, f32);
    losses = acts.take("losses", {N}, f32);

    cos = work.take("rope_cos", {T, D / 2}, f32);
    sin = work.take("rope_sin", {T, D / 2}, f32);
    d_x = work.take("d_x", {N, C}, f32);
    d_ln = work.take("d_ln", {N, C}, f32);
    d_q = work.take("d_q", {N, H * D}, f32);
    d_k = work.take("d_k", {N, KV * D}, f32);
    d_v = work.take("d_v", {N, KV * D}, f32);
    if (!fused) d_probs = work.take("d_probs", {B, H, T, T}, f32);
    d_attn = work.take("d_attn", {N, H * D}, f32);
    d_g = work.take("d_g", {N, F}, f32);
  }

  /// Causal attention in blocks of query rows: block [r0, r1) attends to keys [0, r1) only,
  /// so the products skip the masked upper triangle (about 5/8 of the T x T work at four
  /// blocks; the model-FLOP count keeps the full matrix, docs/performance.md). The entries
  /// beyond r1 are never computed; the softmax kernels never read them and write zeros
  /// there, so P x V and every backward product see the same zeros as a full product.
  /// 64 rows: several of OpenBLAS's 16- or 32-row micro-kernel panels (ten 6-row tiles
  /// and one of 4 in dstrain's kernel, blas::small_gemm_strided_batched, which runs these
  /// products on AVX-512 CPUs), so the shorter products keep their efficiency (fewer,
  /// larger blocks skip less; more blocks pay a call per block and head).
  /// On a GPU one product per head over the whole sequence instead: there each launch
  /// costs more than the masked work it would skip.
  static constexpr std::int64_t kQueryBlock = 64;
  std::int64_t query_block = kQueryBlock;

  template <class Body>
  void for_query_blocks(Body body) const {
    for (std::int64_t r0 = 0; r0 < T; r0 += query_block)
      body(r0, std::min(T, r0 + query_block));
  }

  /// The (sequence, head) groups attention runs in. A GPU runs every sequence and head in
  /// one group (each launch costs more than it would save). A host core runs one
  /// (sequence, head) at a time: that head's T x T probabilities (256 KiB at T = 256) stay
  /// in the core's cache from the scores product through the softmax to P x V, and in
  /// backward the score gradients never leave it; in one group the B x H x T x T floats
  /// (8 MiB for tiny) would stream through memory between the products and the softmax.
  /// Every product and every row's softmax is the same in both orders, and each gradient
  /// that sums over heads and blocks sums them in the same order: the same bits.
  bool one_head_at_a_time() const { return ctx.backend != tensor::Backend::cuda; }

  template <class Body>
  void for_head_groups(Body body) const {
    const std::int64_t seqs = one_head_at_a_time() ? 1 : B;
    const std::int64_t heads = one_head_at_a_time() ? 1 : H;
    for (std::int64_t b0 = 0; b0 < B; b0 += seqs)
      for (std::int64_t h0 = 0; h0 < H; h0 += heads)
        body(b0, seqs, h0, heads);
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

  void attention_forward(const BlockActs& a) {
    if (fused) {
      kernels::fused_attention_forward(ctx, a.q.reshaped({B, T, H, D}), a.k.reshaped({B, T, KV, D}),
                                       a.v.reshaped({B, T, KV, D}), scale,
                                       a.attn.reshaped({B, T, H, D}), a.stats);
      return;
    }
    const std::int64_t group = H / KV;  // query heads per key/value head
    for_head_groups([&](std::int64_t b0, std::int64_t seqs, std::int64_t h0, std::int64_t heads) {
      const float* q = a.q.ptr<float>() + b0 * T * H * D;
      const float* k = a.k.ptr<float>() + b0 * T * KV * D;
      const float* v = a.v.ptr<float>() + b0 * T * KV * D;
      float* p = a.probs.ptr<float>() + b0 * H * T * T;
      float* out = a.attn.ptr<float>() + b0 * T * H * D;
      // One batched product per head and query block over the group's sequences:
      // scores[b, h][r0:r1, 0:r1] = q[b, r0:r1, h, :] (r1-r0, D) x k[b, 0:r1, h / group, :]^T.
      // Rows of q are H*D apart; rows of scores T apart.
      for (std::int64_t h = h0; h < h0 + heads; ++h) {
        const std::int64_t kh = h / group;
        for_query_blocks([&](std::int64_t r0, std::int64_t r1) {
          blas::small_gemm_strided_batched(
              ctx, Trans::no, Trans::yes, r1 - r0, r1, D, q + r0 * H * D + h * D, H * D, T * H * D,
              k + kh * D, KV * D, T * KV * D, false, p + h * T * T + r0 * T, T, H * T * T, seqs);
        });
      }
      const Tensor probs = head_slice(a.probs, b0, seqs, h0, heads);
      kernels::causal_softmax_forward(ctx, probs, scale, probs);
      store(probs);  // softmax in fp32; the probabilities are stored for P x V
      for (std::int64_t h = h0; h < h0 + heads; ++h) {
        const std::int64_t kh = h / group;
        // out[b, r0:r1, h, :] (r1-r0, D) = probs[b, h][r0:r1, 0:r1] x v[b, 0:r1, kh, :]
        for_query_blocks([&](std::int64_t r0, std::int64_t r1) {
          blas::small_gemm_strided_batched(ctx, Trans::no, Trans::no, r1 - r0, D, r1,
                                           p + h * T * T + r0 * T, T, H * T * T, v + kh * D, KV * D,
                                           T * KV * D, false, out + r0 * H * D + h * D, H * D,
                                           T * H * D, seqs);
        });
      }
    });
  }

  void attention_backward(const BlockActs& a) {
    if (fused) {
      kernels::fused_attention_backward(
          ctx, a.q.reshaped({B, T, H, D}), a.k.reshaped({B, T, KV, D}), a.v.reshaped({B, T, KV, D}),
          a.attn.reshaped({B, T, H, D}), d_attn.reshaped({B, T, H, D}), a.stats, scale,
          d_q.reshaped({B, T, H, D}), d_k.reshaped({B, T, KV, D}), d_v.reshaped({B, T, KV, D}));
      kernels::rope_backward(ctx, d_q.reshaped({B, T, H, D}), cos, sin);
      kernels::rope_backward(ctx, d_k.reshaped({B, T, KV, D}), cos, sin);
      return;
    }
    const std::int64_t group = H / KV;
    // Query heads sharing a key/value head, and query blocks, add into its gradient.
    kernels::zero(ctx, d_k);
    kernels::zero(ctx, d_v);
    for_head_groups([&](std::int64_t b0, std::int64_t seqs, std::int64_t h0, std::int64_t heads) {
      const float* q = a.q.ptr<float>() + b0 * T * H * D;
      const float* k = a.k.ptr<float>() + b0 * T * KV * D;
      const float* v = a.v.ptr<float>() + b0 * T * KV * D;
      const float* p = a.probs.ptr<float>() + b0 * H * T * T;
      const float* da = d_attn.ptr<float>() + b0 * T * H * D;
      float* dq = d_q.ptr<float>() + b0 * T * H * D;
      float* dk = d_k.ptr<float>() + b0 * T * KV * D;
      float* dv = d_v.ptr<float>() + b0 * T * KV * D;
      // The group's score gradients: one (T, T) slice reused per (sequence, head) on a
      // host core, so it stays in cache; d_probs keeps the whole (B, H, T, T) a GPU uses.
      const Tensor dprobs = one_head_at_a_time() ? head_slice(d_probs, 0, 1, 0, 1)
                                                 : head_slice(d_probs, b0, seqs, h0, heads);
      // Head h's (T, T) score gradients (the sequences' batch stride is H x T x T).
      auto dp = [&](std::int64_t h) { return dprobs.ptr<float>() + (h - h0) * T * T; };
      for (std::int64_t h = h0; h < h0 + heads; ++h) {
        const std::int64_t kh = h / group;
        for_query_blocks([&](std::int64_t r0, std::int64_t r1) {
          // d_probs[b, h][r0:r1, 0:r1] = d_attn[b, r0:r1, h, :] (r1-r0, D) x v[b, 0:r1, kh, :]^T
          blas::small_gemm_strided_batched(
              ctx, Trans::no, Trans::yes, r1 - r0, r1, D, da + r0 * H * D + h * D, H * D, T * H * D,
              v + kh * D, KV * D, T * KV * D, false, dp(h) + r0 * T, T, H * T * T, seqs);
          // d_v[b, 0:r1, kh, :] (r1, D) += probs[b, h][r0:r1, 0:r1]^T x d_attn[b, r0:r1, h, :]
          blas::small_gemm_strided_batched(ctx, Trans::yes, Trans::no, r1, D, r1 - r0,
                                           p + h * T * T + r0 * T, T, H * T * T,
                                           da + r0 * H * D + h * D, H * D, T * H * D, true,
                                           dv + kh * D, KV * D, T * KV * D, seqs);
        });
      }
      kernels::causal_softmax_backward(ctx, head_slice(a.probs, b0, seqs, h0, heads), dprobs, scale,
                                       dprobs);  // -> d_scores
      for (std::int64_t h = h0; h < h0 + heads; ++h) {
        const std::int64_t kh = h / group;
        for_query_blocks([&](std::int64_t r0, std::int64_t r1) {
          // d_q[b, r0:r1, h, :] (r1-r0, D) = d_scores[b, h][r0:r1, 0:r1] x k[b, 0:r1, kh, :]
          blas::small_gemm_strided_batched(
              ctx, Trans::no, Trans::no, r1 - r0, D, r1, dp(h) + r0 * T, T, H * T * T, k + kh * D,
              KV * D, T * KV * D, false, dq + r0 * H * D + h * D, H * D, T * H * D, seqs);
          // d_k[b, 0:r1, kh, :] (r1, D) += d_scores[b, h][r0:r1, 0:r1]^T x q[b, r0:r1, h, :]
          blas::small_gemm_strided_batched(ctx, Trans::yes, Trans::no, r1, D, r1 - r0,
                                           dp(h) + r0 * T, T, H * T * T, q + r0 * H * D + h * D,
                                           H * D, T * H * D, true, dk + kh * D, KV * D, T * KV * D,
                                           seqs);
        });
      }
    });
    kernels::rope_backward(ctx, d_q.reshaped({B, T, H, D}), cos, sin);
    kernels::rope_backward(ctx, d_k.reshaped({B, T, KV, D}), cos, sin);
  }

  void forward_pass(ParamStore& ps, const std::int32_t* tok, const std::int32_t* tgt) {
    tensor::copy(ctx, tokens.data, tok, static_cast<std::size_t>(N) * sizeof(std::int32_t));
    tensor::copy(ctx, targets.data, tgt, static_cast<std::size_t>(N) * sizeof(std::int32_t));
    // store(): each activation as a 16-bit back end would keep it (identity for f32).
    // Norm statistics (rstd), softmax and the loss reduce in fp32 and are not rounded.
    kernels::embedding_forward(ctx, tokens, weight(ps, wte), layer[0].x);
    for (std::int64_t l = 0; l < L; ++l) {
      const BlockParams& w = blocks[static_cast<std::size_t>(l)];
      BlockActs& a = layer[static_cast<std::size_t>(l)];
      kernels::rmsnorm_forward(ctx, a.x, weight(ps, w.ln1), eps, a.ln1, a.rstd1);
      store(a.ln1);
      blas::linear_forward(ctx, a.ln1, weight(ps, w.q), a.q);
      blas::linear_forward(ctx, a.ln1, weight(ps, w.k), a.k);
      blas::linear_forward(ctx, a.ln1, weight(ps, w.v), a.v);
      kernels::rope_forward(ctx, a.q.reshaped({B, T, H, D}), cos, sin);
      kernels::rope_forward(ctx, a.k.reshaped({B, T, KV, D}), cos, sin);
      store(a.q);
      store(a.k);
      store(a.v);
      attention_forward(a);
      store(a.attn);
      blas::linear_forward(ctx, a.attn, weight(ps, w.o), a.mid);
      kernels::add(ctx, a.mid, a.x, a.mid);
      store(a.mid);  // the residual stream
      kernels::rmsnorm_forward(ctx, a.mid, weight(ps, w.ln2), eps, a.ln2, a.rstd2);
      store(a.ln2);
      blas::linear_forward(ctx, a.ln2, weight(ps, w.gate), a.h1);
      blas::linear_forward(ctx, a.ln2, weight(ps, w.up), a.h3);
      store(a.h1);
      store(a.h3);
      kernels::swiglu_forward(ctx, a.h1, a.h3, a.g);
      store(a.g);
      const Tensor& next = l + 1 < L ? layer[static_cast<std::size_t>(l + 1)].x : final_x;
      blas::linear_forward(ctx, a.g, weight(ps, w.down), next);
      kernels::add(ctx, next, a.mid, next);
      store(next);  // the residual stream: the next block's input
    }
    kernels::rmsnorm_forward(ctx, final_x, weight(ps, norm), eps, lnf, rstdf);
    store(lnf);
    blas::linear_forward(ctx, lnf, weight(ps, head), logits);
    store(logits);  // the loss itself is computed in fp32 from the stored logits
  }

  void backward_pass(ParamStore& ps, const std::function<void(std::size_t)>& on_ready) {
    auto ready = [&](std::size_t offset) {
      if (on_ready) on_ready(offset);
    };
    // Weight gradients accumulate in fp32 (the ParamStore's gradient buffer); the
    // activation gradients that feed matrix products are stored (store()) like the
    // forward's activations, which is where fp16 needs the loss scale.
    // logits now holds d(loss)/d(logits) (cross_entropy_fused wrote it in place).
    store(logits);
    blas::linear_backward(ctx, logits, lnf, weight(ps, head), d_ln, ps.grad(head));
    kernels::zero(ctx, d_x);
    kernels::rmsnorm_backward(ctx, d_ln, final_x, weight(ps, norm), rstdf, d_x, ps.grad(norm));
    // Tied: the head's gradient is the embedding's, final only at the very end.
    if (!m.tie_embeddings) ready(std::min(ps.spec(norm).offset, ps.spec(head).offset));
    for (std::int64_t l = L - 1; l >= 0; --l) {
      const BlockParams& w = blocks[static_cast<std::size_t>(l)];
      const BlockActs& a = layer[static_cast<std::size_t>(l)];
      // MLP branch: next = mid + down(g); d_x holds d(loss)/d(next).
      store(d_x);
      blas::linear_backward(ctx, d_x, a.g, weight(ps, w.down), d_g, ps.grad(w.down));
      // d_h1 and d_h3 overwrite h1 and h3, which nothing reads after this (swiglu_backward
      // allows the alias): two (N, F) buffers fewer in the workspace.
      const Tensor& d_h1 = a.h1;
      const Tensor& d_h3 = a.h3;
      kernels::swiglu_backward(ctx, d_g, a.h1, a.h3, d_h1, d_h3);
      store(d_h1);
      store(d_h3);
      blas::linear_backward(ctx, d_h1, a.ln2, weight(ps, w.gate), d_ln, ps.grad(w.gate));
      blas::linear_backward(ctx, d_h3, a.ln2, weight(ps, w.up), d_ln, ps.grad(w.up), true);
      kernels::rmsnorm_backward(ctx, d_ln, a.mid, weight(ps, w.ln2), a.rstd2, d_x, ps.grad(w.ln2));
      ready(ps.spec(w.ln2).offset);  // a chance to poll in-flight buckets mid-block
      // Attention branch: mid = x + o_proj(attn); d_x now holds d(loss)/d(mid).
      store(d_x);
      blas::linear_backward(ctx, d_x, a.attn, weight(ps, w.o), d_attn, ps.grad(w.o));
      store(d_attn);
      attention_backward(a);
      store(d_q);
      store(d_k);
      store(d_v);
      blas::linear_backward(ctx, d_q, a.ln1, weight(ps, w.q), d_ln, ps.grad(w.q));
      blas::linear_backward(ctx, d_k, a.ln1, weight(ps, w.k), d_ln, ps.grad(w.k), true);
      blas::linear_backward(ctx, d_v, a.ln1, weight(ps, w.v), d_ln, ps.grad(w.v), true);
      kernels::rmsnorm_backward(ctx, d_ln, a.x, weight(ps, w.ln1), a.rstd1, d_x, ps.grad(w.ln1));
      ready(ps.spec(w.ln1).offset);  // the block's first tensor: the whole block is final
    }
    kernels::embedding_backward(ctx, tokens, d_x, ps.grad(wte));
    ready(0);
  }

  /// The loss sum over the targets that count (`tgt`: the host copy of targets). On a
  /// device the N per-token losses come to the host first (a few KiB per micro-batch).
  double sum_losses(const std::int32_t* tgt, std::int64_t* valid) {
    const float* l = losses.ptr<float>();
    if (tensor::device_of(ctx) != tensor::Device::host) {
      host_losses.resize(static_cast<std::size_t>(N));
      tensor::download(ctx, losses, host_losses.data());
      l = host_losses.data();
    }
    const std::int32_t* t = tgt;
    double sum = 0.0;  // fixed order: deterministic
    std::int64_t n = 0;
    for (std::int64_t i = 0; i < N; ++i) {
      if (t[i] == kIgnoreIndex) continue;
      sum += static_cast<double>(l[i]);
      ++n;
    }
    if (valid) *valid = n;
    return sum;
  }
};

DenseModel::DenseModel(const config::ModelSection& m, std::int64_t batch, std::int64_t seq_len,
                       tensor::Arena::Mode mode, tensor::ExecContext ctx, DType storage,
                       bool deterministic, float* gradient_memory, float* param_memory)
    : impl_(std::make_unique<Impl>()),
      params_(std::make_unique<ParamStore>(dense_parameter_layout(m), mode, ctx, gradient_memory,
                                           param_memory)),
      B_(batch),
      T_(seq_len) {
  if (batch < 1 || seq_len < 1 || seq_len > m.max_seq_len)
    throw Error("model: micro-batch " + std::to_string(batch) + " x seq_len " +
                std::to_string(seq_len) + " is invalid for max_seq_len " +
                std::to_string(m.max_seq_len));
  if (m.d_model % m.n_heads != 0 || m.n_heads % m.n_kv_heads != 0 ||
      (m.d_model / m.n_heads) % 2 != 0)
    throw Error(
        "model: d_model must split into n_heads even head dims and n_kv_heads must "
        "divide n_heads");
  if (storage != DType::f32 && storage != DType::bf16 && storage != DType::f16)
    throw Error("model: storage type must be f32, bf16 or f16, got " +
                std::string(dtype_name(storage)));
  Impl& s = *impl_;
  s.m = m;
  s.ctx = ctx;
  // The matrix products multiply in the storage type: their operands are rounded to it.
  s.ctx.math = storage;
  s.storage = storage;
  if (ctx.backend == tensor::Backend::cuda) s.query_block = seq_len;
  s.B = batch;
  s.T = seq_len;
  s.N = batch * seq_len;
  s.C = m.d_model;
  s.H = m.n_heads;
  s.KV = m.n_kv_heads;
  s.D = m.d_model / m.n_heads;
  s.F = m.ffn_dim;
  s.V = m.vocab_size;
  s.L = m.n_layers;
  s.eps = static_cast<float>(m.norm_eps);
  s.scale = 1.0f / std::sqrt(static_cast<float>(s.D));

  const ParamStore& ps = *params_;
  s.wte = ps.index_of("model.embed_tokens.weight");
  s.norm = ps.index_of("model.norm.weight");
  s.head = m.tie_embeddings ? s.wte : ps.index_of("lm_head.weight");
  for (std::int64_t l = 0; l < m.n_layers; ++l) {
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    s.blocks.push_back(BlockParams{
        ps.index_of(pre + "input_layernorm.weight"), ps.index_of(pre + "self_attn.q_proj.weight"),
        ps.index_of(pre + "self_attn.k_proj.weight"), ps.index_of(pre + "self_attn.v_proj.weight"),
        ps.index_of(pre + "self_attn.o_proj.weight"),
        ps.index_of(pre + "post_attention_layernorm.weight"),
        ps.index_of(pre + "mlp.gate_proj.weight"), ps.index_of(pre + "mlp.up_proj.weight"),
        ps.index_of(pre + "mlp.down_proj.weight")});
  }
  s.fused = !deterministic && kernels::fused_attention_supported(s.ctx, s.B, s.T, s.H, s.KV, s.D);
  // Layout pass, then (for a real model) the same layout over blocks of the planned size.
  s.take_all();
  if (mode == Arena::Mode::allocate) {
    const std::size_t act_bytes = s.acts.used_bytes();
    const std::size_t work_bytes = s.work.used_bytes();
    const tensor::Device dev = tensor::device_of(ctx);
    s.acts = Arena("activations", Arena::Mode::allocate, act_bytes, dev, ctx.stream);
    s.work = Arena("workspace", Arena::Mode::allocate, work_bytes, dev, ctx.stream);
    s.take_all();
    kernels::rope_tables(s.ctx, m.rope_theta, s.cos, s.sin);
    if (storage != DType::f32) {
      // The host emulation keeps the rounded copy in f32 (a 16-bit back end: half the
      // bytes; plan.cpp counts those). Filled by refresh_compute_params().
      const std::size_t n = ps.buffer_elements();
      s.compute =
          Arena("compute parameters", Arena::Mode::allocate, n * sizeof(float), dev, ctx.stream);
      s.compute_base =
          s.compute.take("compute copy", {static_cast<std::int64_t>(n)}, DType::f32).ptr<float>();
      refresh_compute_params();
    }
  }
}

DenseModel::~DenseModel() = default;

DType DenseModel::storage() const {
  return impl_->storage;
}

bool DenseModel::fused_attention() const {
  return impl_->fused;
}

void DenseModel::refresh_compute_params() {
  Impl& s = *impl_;
  if (!s.compute_base) return;
  const std::size_t n = params_->buffer_elements();
  tensor::copy(s.ctx, s.compute_base, params_->params_data(), n * sizeof(float));
  Tensor all = params_->params_flat();
  all.data = s.compute_base;
  kernels::round_to_storage(s.ctx, all, s.storage);
}

ModelMemory DenseModel::memory() const {
  ModelMemory mem;
  mem.parameters = params_->buffer_elements() * sizeof(float);
  mem.gradients = params_->buffer_elements() * sizeof(float);
  mem.activations = impl_->acts.used_bytes();
  mem.workspace = impl_->work.used_bytes();
  return mem;
}

double DenseModel::forward(const std::int32_t* tokens, const std::int32_t* targets,
                           std::int64_t* valid_tokens) {
  if (params_->planning()) throw Error("model: forward() on a model built only to plan");
  const auto t0 = std::chrono::steady_clock::now();
  impl_->forward_pass(*params_, tokens, targets);
  kernels::cross_entropy_forward(impl_->ctx, impl_->logits, impl_->targets, kIgnoreIndex,
                                 impl_->losses);
  const double loss = impl_->sum_losses(targets, valid_tokens);  // waits for the device
  impl_->forward_s = seconds_since(t0);
  impl_->backward_s = 0.0;
  return loss;
}

double DenseModel::forward_backward(const std::int32_t* tokens, const std::int32_t* targets,
                                    float grad_scale, std::int64_t* valid_tokens,
                                    const std::function<void(std::size_t)>& on_ready) {
  if (params_->planning()) throw Error("model: forward_backward() on a model built only to plan");
  Impl& s = *impl_;
  const auto t0 = std::chrono::steady_clock::now();
  s.forward_pass(*params_, tokens, targets);
  kernels::cross_entropy_fused(s.ctx, s.logits, s.targets, kIgnoreIndex, grad_scale, s.losses,
                               s.logits);
  const double loss = s.sum_losses(targets, valid_tokens);  // waits for the device
  const auto t1 = std::chrono::steady_clock::now();
  s.forward_s = std::chrono::duration<double>(t1 - t0).count();
  s.backward_pass(*params_, on_ready);
  tensor::synchronize(s.ctx);  // a device's backward has run, not only been enqueued
  s.backward_s = seconds_since(t1);
  return loss;
}

double DenseModel::last_forward_seconds() const {
  return impl_->forward_s;
}
double DenseModel::last_backward_seconds() const {
  return impl_->backward_s;
}

tensor::Tensor DenseModel::logits() const {
  return impl_->logits;
}

}  // namespace dst::model
