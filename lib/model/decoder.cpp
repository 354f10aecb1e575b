#include "model/decoder.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>

#include "blas/gemm.hpp"
#include "core/error.hpp"
#include "core/rng.hpp"
#include "kernels/kernels.hpp"

namespace dst::model {

namespace {
using blas::Trans;
using tensor::Arena;
using tensor::Shape;
using tensor::Tensor;

/// The first `n` rows of a 1-D or 2-D tensor (rows are contiguous).
Tensor rows(const Tensor& t, std::int64_t n) {
  Tensor r = t;
  r.shape = t.shape.rank == 1 ? Shape{n} : Shape{n, t.shape[1]};
  return r;
}

/// Rows [first, first + n) of a 2-D f32 tensor.
Tensor row_range(const Tensor& t, std::int64_t first, std::int64_t n) {
  Tensor r = t;
  r.data = t.ptr<float>() + first * t.shape[1];
  r.shape = Shape{n, t.shape[1]};
  return r;
}

struct LayerParams {
  std::size_t ln1, q, k, v, o, ln2, gate, up, down;
};
}  // namespace

struct Decoder::Impl {
  const ParamStore* ps = nullptr;
  tensor::ExecContext ctx;
  std::int64_t S, C, H, KV, D, F, V, L;  // S = max_len
  float eps = 0.0f, scale = 0.0f;
  double theta = 0.0;
  std::int64_t pos = 0;
  std::size_t wte = 0, norm = 0, head = 0;
  std::vector<LayerParams> layers;

  Arena arena{"decoder", Arena::Mode::plan};
  Tensor tokens;            // (S) i32
  Tensor x;                 // (S, C) residual stream of the rows being run
  Tensor ln;                // (S, C) rmsnorm output
  Tensor rstd;              // (S)
  Tensor q;                 // (S, H*D) after RoPE
  Tensor attn;              // (S, H*D)
  Tensor mid;               // (S, C)
  Tensor h1, h3, g;         // (S, F)
  Tensor scores;            // (S, S) one head's scores, then probabilities
  Tensor logits;            // (S, V)
  Tensor k_cache, v_cache;  // (L*S, KV*D): layer l's rows start at l*S
  Tensor cos, sin;          // (S, D/2) RoPE tables of positions 0..S-1

  void take_all() {
    const auto f32 = DType::f32;
    tokens = arena.take("tokens", {S}, DType::i32);
    x = arena.take("x", {S, C}, f32);
    ln = arena.take("ln", {S, C}, f32);
    rstd = arena.take("rstd", {S}, f32);
    q = arena.take("q", {S, H * D}, f32);
    attn = arena.take("attn", {S, H * D}, f32);
    mid = arena.take("mid", {S, C}, f32);
    h1 = arena.take("h1", {S, F}, f32);
    h3 = arena.take("h3", {S, F}, f32);
    g = arena.take("g", {S, F}, f32);
    scores = arena.take("scores", {S, S}, f32);
    logits = arena.take("logits", {S, V}, f32);
    k_cache = arena.take("k_cache", {L * S, KV * D}, f32);
    v_cache = arena.take("v_cache", {L * S, KV * D}, f32);
    cos = arena.take("rope_cos", {S, D / 2}, f32);
    sin = arena.take("rope_sin", {S, D / 2}, f32);
  }

  /// probs[i, j] = softmax_j<=p0+i (scale * scores[i, j]), 0 beyond: the causal mask of
  /// rows that start at position p0. The same arithmetic as the Kokkos causal softmax
  /// (float exponentials of the max-shifted scaled scores, double sum, one reciprocal).
  void masked_softmax(std::int64_t n, std::int64_t p0, std::int64_t len) {
    float* sc = scores.ptr<float>();
    for (std::int64_t i = 0; i < n; ++i) {
      float* r = sc + i * len;
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

  void layer(std::int64_t l, std::int64_t n, std::int64_t p0) {
    const LayerParams& w = layers[static_cast<std::size_t>(l)];
    const std::int64_t len = p0 + n;  // keys the new rows attend to
    const Tensor xs = rows(x, n), lns = rows(ln, n), rs = rows(rstd, n);
    const Tensor qs = rows(q, n), as = rows(attn, n), ms = rows(mid, n);
    const Tensor kc = row_range(k_cache, l * S + p0, n);  // (n, KV*D) this layer's new rows
    const Tensor vc = row_range(v_cache, l * S + p0, n);
    const Tensor cs = row_range(cos, p0, n), sn = row_range(sin, p0, n);
    kernels::rmsnorm_forward(ctx, xs, ps->param(w.ln1), eps, lns, rs);
    blas::linear_forward(ctx, lns, ps->param(w.q), qs);
    blas::linear_forward(ctx, lns, ps->param(w.k), kc);
    blas::linear_forward(ctx, lns, ps->param(w.v), vc);
    kernels::rope_forward(ctx, qs.reshaped({1, n, H, D}), cs, sn);
    kernels::rope_forward(ctx, kc.reshaped({1, n, KV, D}), cs, sn);
    const std::int64_t group = H / KV;                        // query heads per key/value head
    const float* kl = k_cache.ptr<float>() + l * S * KV * D;  // (len, KV*D) cached keys
    const float* vl = v_cache.ptr<float>() + l * S * KV * D;
    float* sc = scores.ptr<float>();
    for (std::int64_t h = 0; h < H; ++h) {
      const std::int64_t kh = h / group;
      // scores (n, len) = q[:, h, :] (n, D) x k[:len, kh, :]^T
      blas::gemm(ctx, Trans::no, Trans::yes, n, len, D, 1.0f, qs.ptr<float>() + h * D, H * D,
                 kl + kh * D, KV * D, 0.0f, sc, len);
      masked_softmax(n, p0, len);
      // attn[:, h, :] (n, D) = probs (n, len) x v[:len, kh, :] (len, D)
      blas::gemm(ctx, Trans::no, Trans::no, n, D, len, 1.0f, sc, len, vl + kh * D, KV * D, 0.0f,
                 as.ptr<float>() + h * D, H * D);
    }
    blas::linear_forward(ctx, as, ps->param(w.o), ms);
    kernels::add(ctx, ms, xs, ms);
    kernels::rmsnorm_forward(ctx, ms, ps->param(w.ln2), eps, lns, rs);
    const Tensor h1s = rows(h1, n), h3s = rows(h3, n), gs = rows(g, n);
    blas::linear_forward(ctx, lns, ps->param(w.gate), h1s);
    blas::linear_forward(ctx, lns, ps->param(w.up), h3s);
    kernels::swiglu_forward(ctx, h1s, h3s, gs);
    blas::linear_forward(ctx, gs, ps->param(w.down), xs);
    kernels::add(ctx, xs, ms, xs);
  }
};

Decoder::Decoder(const config::ModelSection& m, const ParamStore& params, std::int64_t max_len,
                 tensor::ExecContext ctx)
    : impl_(std::make_unique<Impl>()) {
  if (max_len < 1 || max_len > m.max_seq_len)
    throw Error("decoder: max_len " + std::to_string(max_len) + " must be in [1, max_seq_len " +
                std::to_string(m.max_seq_len) + "]");
  if (m.d_model % m.n_heads != 0 || m.n_heads % m.n_kv_heads != 0 ||
      (m.d_model / m.n_heads) % 2 != 0)
    throw Error(
        "decoder: d_model must split into n_heads even head dims and n_kv_heads must divide "
        "n_heads");
  if (ctx.backend != tensor::Backend::kokkos)
    throw Error("decoder: runs on the host (kokkos) back end, not " +
                std::string(tensor::backend_name(ctx.backend)));
  if (params.planning()) throw Error("decoder: the parameter store only plans (no weights)");
  Impl& s = *impl_;
  s.ps = &params;
  s.ctx = ctx;
  s.S = max_len;
  s.C = m.d_model;
  s.H = m.n_heads;
  s.KV = m.n_kv_heads;
  s.D = m.d_model / m.n_heads;
  s.F = m.ffn_dim;
  s.V = m.vocab_size;
  s.L = m.n_layers;
  s.eps = static_cast<float>(m.norm_eps);
  s.scale = 1.0f / std::sqrt(static_cast<float>(s.D));  // as DenseModel
  s.theta = m.rope_theta;
  // The store must be laid out for this config: same names, same shapes.
  const std::vector<ParamSpec> want = dense_parameter_layout(m);
  if (want.size() != params.size())
    throw Error("decoder: the parameter store has " + std::to_string(params.size()) +
                " tensors, the model config " + std::to_string(want.size()));
  for (const ParamSpec& w : want) {
    const ParamSpec& have = params.spec(params.index_of(w.name));
    if (have.shape != w.shape)
      throw Error("decoder: parameter " + w.name + " has shape " + have.shape.str() +
                  ", the model config " + w.shape.str());
  }
  s.wte = params.index_of("model.embed_tokens.weight");
  s.norm = params.index_of("model.norm.weight");
  s.head = m.tie_embeddings ? s.wte : params.index_of("lm_head.weight");
  for (std::int64_t l = 0; l < s.L; ++l) {
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    s.layers.push_back(LayerParams{params.index_of(pre + "input_layernorm.weight"),
                                   params.index_of(pre + "self_attn.q_proj.weight"),
                                   params.index_of(pre + "self_attn.k_proj.weight"),
                                   params.index_of(pre + "self_attn.v_proj.weight"),
                                   params.index_of(pre + "self_attn.o_proj.weight"),
                                   params.index_of(pre + "post_attention_layernorm.weight"),
                                   params.index_of(pre + "mlp.gate_proj.weight"),
                                   params.index_of(pre + "mlp.up_proj.weight"),
                                   params.index_of(pre + "mlp.down_proj.weight")});
  }
  s.take_all();  // layout pass
  s.arena = Arena("decoder", Arena::Mode::allocate, s.arena.used_bytes());
  s.take_all();
  kernels::rope_tables(s.ctx, s.theta, s.cos, s.sin);
}

Decoder::~Decoder() = default;

void Decoder::reset() {
  impl_->pos = 0;
}
std::int64_t Decoder::position() const {
  return impl_->pos;
}
std::int64_t Decoder::max_len() const {
  return impl_->S;
}
std::int64_t Decoder::vocab_size() const {
  return impl_->V;
}

tensor::Tensor Decoder::append(const std::int32_t* tokens, std::int64_t n, bool all_logits) {
  Impl& s = *impl_;
  if (n < 1) throw Error("decoder: append() needs at least one token, got " + std::to_string(n));
  if (s.pos + n > s.S)
    throw Error("decoder: " + std::to_string(s.pos) + " cached + " + std::to_string(n) +
                " new tokens exceed max_len " + std::to_string(s.S));
  const std::int64_t p0 = s.pos;
  std::memcpy(s.tokens.data, tokens, static_cast<std::size_t>(n) * sizeof(std::int32_t));
  Tensor tok = s.tokens;
  tok.shape = Shape{n};
  kernels::embedding_forward(s.ctx, tok, s.ps->param(s.wte), rows(s.x, n));
  for (std::int64_t l = 0; l < s.L; ++l)
    s.layer(l, n, p0);
  s.pos += n;
  // Only the rows whose logits are wanted go through the final norm and the head.
  const std::int64_t first = all_logits ? 0 : n - 1;
  const std::int64_t m = n - first;
  const Tensor xs = row_range(s.x, first, m), lns = rows(s.ln, m);
  kernels::rmsnorm_forward(s.ctx, xs, s.ps->param(s.norm), s.eps, lns, rows(s.rstd, m));
  const Tensor out = rows(s.logits, m);
  blas::linear_forward(s.ctx, lns, s.ps->param(s.head), out);
  return out;
}

// --- sampling ----------------------------------------------------------------------------

void validate(const SamplingOptions& o) {
  if (!(o.temperature >= 0.0) || !std::isfinite(o.temperature))
    throw Error("generate: temperature must be finite and >= 0, got " +
                std::to_string(o.temperature));
  if (o.top_k < 0) throw Error("generate: top-k must be >= 0, got " + std::to_string(o.top_k));
  if (!(o.top_p > 0.0 && o.top_p <= 1.0))
    throw Error("generate: top-p must be in (0, 1], got " + std::to_string(o.top_p));
}

namespace {
std::int32_t argmax(const float* logits, std::int64_t vocab) {
  std::int64_t best = 0;
  for (std::int64_t j = 0; j < vocab; ++j) {
    if (!std::isfinite(logits[j]))
      throw Error("generate: logit " + std::to_string(j) + " is not finite");
    if (logits[j] > logits[best]) best = j;
  }
  return static_cast<std::int32_t>(best);
}
}  // namespace

std::vector<std::pair<std::int32_t, double>> sampling_distribution(const float* logits,
                                                                   std::int64_t vocab,
                                                                   const SamplingOptions& o) {
  validate(o);
  if (vocab < 1) throw Error("generate: empty vocabulary");
  const std::int32_t best = argmax(logits, vocab);  // also rejects non-finite logits
  if (o.temperature == 0.0) return {{best, 1.0}};
  const double top = static_cast<double>(logits[best]) / o.temperature;
  std::vector<std::pair<std::int32_t, double>> d(static_cast<std::size_t>(vocab));
  for (std::int64_t j = 0; j < vocab; ++j)
    d[static_cast<std::size_t>(j)] = {
        static_cast<std::int32_t>(j),
        std::exp(static_cast<double>(logits[j]) / o.temperature - top)};
  std::stable_sort(d.begin(), d.end(), [](const auto& a, const auto& b) {
    return a.second > b.second;  // stable: equal weights stay in id order
  });
  if (o.top_k > 0 && static_cast<std::size_t>(o.top_k) < d.size())
    d.resize(static_cast<std::size_t>(o.top_k));
  double total = 0.0;
  for (const auto& e : d)
    total += e.second;
  if (o.top_p < 1.0) {  // the smallest prefix holding top_p of the (top-k) mass
    double cum = 0.0;
    std::size_t keep = 0;
    while (keep < d.size()) {
      cum += d[keep++].second;
      if (cum >= o.top_p * total) break;
    }
    d.resize(keep);
    total = cum;
  }
  for (auto& e : d)
    e.second /= total;
  return d;
}

std::int32_t sample_token(const float* logits, std::int64_t vocab, const SamplingOptions& o,
                          std::uint64_t index) {
  validate(o);
  if (o.temperature == 0.0) return argmax(logits, vocab);
  const auto d = sampling_distribution(logits, vocab, o);
  static const std::uint64_t stream = core::hash_name("generate.sample");
  const double u = core::uniform01(o.seed, stream, index);
  double cum = 0.0;
  for (const auto& e : d) {
    cum += e.second;
    if (u < cum) return e.first;
  }
  return d.back().first;  // u within rounding of 1
}

}  // namespace dst::model
