#include "model/decoder.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "model/transformer.hpp"
#include "tensor/memory.hpp"

namespace dst::model {

namespace {
using tensor::Arena;
using tensor::Shape;
using tensor::Tensor;

/// The first `n` rows of a 1-D or 2-D tensor.
Tensor rows(const Tensor& t, std::int64_t n) {
  return row_range(t, 0, n);
}
}  // namespace

struct Decoder::Impl {
  Transformer net;
  Compute c;                             // f32 on the master parameters
  std::int64_t S, C, H, KV, D, F, V, L;  // S = max_len
  std::int64_t pos = 0;

  Arena arena{"decoder", Arena::Mode::plan};
  Tensor tokens;            // (S) i32
  Tensor x;                 // (S, C) residual stream of the rows being run
  Tensor ln;                // (S, C) rmsnorm output (both norms of a block, and the final)
  Tensor rstd;              // (S)
  Tensor q;                 // (S, H*D) after RoPE
  Tensor attn;              // (S, H*D)
  Tensor mid;               // (S, C)
  Tensor h1, h3, g;         // (S, F)
  Tensor scores;            // (S, S) one head's scores, then probabilities
  Tensor logits;            // (S, V)
  Tensor k_cache, v_cache;  // (L*S, KV*D): layer l's rows start at l*S
  Rope rope;                // (S, rope dim / 2) RoPE tables of positions 0..S-1

  // Latent attention (model.kv_lora_rank > 0): Q = H*(nope+rope) query columns, A = H*v
  // output columns; the cache holds R = kv_lora latent and P = rope key values per token.
  bool mla = false;
  std::int64_t Q = 0, A = 0, R = 0, P = 0, QL = 0;  // QL: q_lora_rank (0: no query latent)
  Tensor q_a, q_n;                                  // (S, QL) the query latent, normalised
  Tensor c_kv;                                      // (S, R) latents before their norm
  Tensor latent_cache, k_pe_cache;  // (L*S, R), (L*S, P): layer l's rows start at l*S
  Tensor q_lat, o_lat;              // (S, R) one head's absorbed query, weighted latents
  // DeepSeekMoE blocks: one record of S rows, shared by every MoE block (nothing is kept
  // for a backward); its routing's expert loads are counted but never read.
  const Moe* moe = nullptr;
  MoeActs moe_acts;

  explicit Impl(const config::ModelSection& m) : net(m) {}

  void take_all() {
    const auto f32 = DType::f32;
    tokens = arena.take("tokens", {S}, DType::i32);
    x = arena.take("x", {S, C}, f32);
    ln = arena.take("ln", {S, C}, f32);
    rstd = arena.take("rstd", {S}, f32);
    q = arena.take("q", {S, mla ? Q : H * D}, f32);
    attn = arena.take("attn", {S, mla ? A : H * D}, f32);
    mid = arena.take("mid", {S, C}, f32);
    if (F > 0) {  // some block has the dense MLP
      h1 = arena.take("h1", {S, F}, f32);
      h3 = arena.take("h3", {S, F}, f32);
      g = arena.take("g", {S, F}, f32);
    }
    scores = arena.take("scores", {S, S}, f32);
    logits = arena.take("logits", {S, V}, f32);
    if (mla) {
      c_kv = arena.take("c_kv", {S, R}, f32);
      if (QL > 0) {
        q_a = arena.take("q_a", {S, QL}, f32);
        q_n = arena.take("q_n", {S, QL}, f32);
      }
      latent_cache = arena.take("latent_cache", {L * S, R}, f32);
      k_pe_cache = arena.take("k_pe_cache", {L * S, P}, f32);
      q_lat = arena.take("q_lat", {S, R}, f32);
      o_lat = arena.take("o_lat", {S, R}, f32);
    } else {
      k_cache = arena.take("k_cache", {L * S, KV * D}, f32);
      v_cache = arena.take("v_cache", {L * S, KV * D}, f32);
    }
    if (moe) moe_acts = moe->take(arena, S, !arena.planning());
    rope = Rope::take(arena, S, net.block(0).head_dim());
  }

  /// The record of a block over `n` rows: views of the scratch rows, which every block
  /// reuses (decoding keeps nothing for a backward). Both norms share ln and rstd.
  BlockActs block_rows(std::int64_t n) const {
    BlockActs a;
    a.x = rows(x, n);
    a.norm1 = RmsNormActs{rows(ln, n), rows(rstd, n)};
    if (mla) {
      a.mla.q = rows(q, n);
      a.mla.c_kv = rows(c_kv, n);
      if (QL > 0) {
        a.mla.q_a = rows(q_a, n);
        a.mla.q_norm = RmsNormActs{rows(q_n, n), rows(rstd, n)};  // rstd: no backward reads it
      }
      a.mla.kv_norm = RmsNormActs{Tensor{}, rows(rstd, n)};  // out: the cache's rows
      a.mla.attn = rows(attn, n);
    } else {
      a.attn.q = rows(q, n);
      a.attn.probs = scores;
      a.attn.attn = rows(attn, n);
    }
    a.mid = rows(mid, n);
    a.norm2 = a.norm1;
    if (F > 0) a.mlp = MlpActs{rows(h1, n), rows(h3, n), rows(g, n)};
    if (moe) {
      const std::int64_t k = moe_acts.xs.shape[0] / S;  // slots per token
      a.moe = moe_acts;
      if (moe_acts.shared.h1.data)
        a.moe.shared = MlpActs{rows(moe_acts.shared.h1, n), rows(moe_acts.shared.h3, n),
                               rows(moe_acts.shared.g, n)};
      a.moe.logits = rows(moe_acts.logits, n);
      a.moe.xs = rows(moe_acts.xs, n * k);
      a.moe.h1 = rows(moe_acts.h1, n * k);
      a.moe.h3 = rows(moe_acts.h3, n * k);
      a.moe.g = rows(moe_acts.g, n * k);
      a.moe.y = rows(moe_acts.y, n * k);
    }
    return a;
  }

  /// Layer l's cache, holding positions [0, p0).
  KVCache cache(std::int64_t l, std::int64_t p0) const {
    return KVCache{row_range(k_cache, l * S, S), row_range(v_cache, l * S, S), p0};
  }
  /// Layer l's latent cache (latent attention), holding positions [0, p0).
  LatentKVCache latent(std::int64_t l, std::int64_t p0) const {
    return LatentKVCache{row_range(latent_cache, l * S, S),
                         row_range(k_pe_cache, l * S, S),
                         q_lat,
                         o_lat,
                         scores,
                         p0};
  }
};

Decoder::Decoder(const config::ModelSection& m, const ParamStore& params, std::int64_t max_len,
                 tensor::ExecContext ctx)
    : impl_(std::make_unique<Impl>(m)) {
  if (max_len < 1 || max_len > m.max_seq_len)
    throw Error("decoder: max_len " + std::to_string(max_len) + " must be in [1, max_seq_len " +
                std::to_string(m.max_seq_len) + "]");
  if (!m.mla() && (m.d_model % m.n_heads != 0 || m.n_heads % m.n_kv_heads != 0 ||
                   (m.d_model / m.n_heads) % 2 != 0))
    throw Error(
        "decoder: d_model must split into n_heads even head dims and n_kv_heads must divide "
        "n_heads");
  // The cached attention's softmax is a host loop over the scores (Attention::forward).
  if (tensor::device_of(ctx) != tensor::Device::host)
    throw Error("decoder: runs on the host, not on the device of the " +
                std::string(tensor::backend_name(ctx.backend)) + " back end");
  if (params.planning()) throw Error("decoder: the parameter store only plans (no weights)");
  Impl& s = *impl_;
  s.c.ctx = ctx;
  s.c.params = &params;
  s.S = max_len;
  s.C = m.d_model;
  s.H = m.n_heads;
  s.KV = m.n_kv_heads;
  s.D = m.d_model / m.n_heads;
  s.V = m.vocab_size;
  s.L = m.n_layers;
  // The dense MLP's width when some block has it; an MoE block's record is its own.
  bool dense_mlp = false;
  for (std::int64_t l = 0; l < s.L; ++l) {
    if (const Moe* moe = s.net.block(l).moe())
      s.moe = moe;
    else
      dense_mlp = true;
  }
  s.F = dense_mlp ? m.ffn_dim : 0;
  s.mla = m.mla();
  if (s.mla) {
    s.Q = m.n_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim);
    s.A = m.n_heads * m.v_head_dim;
    s.R = m.kv_lora_rank;
    s.P = m.qk_rope_head_dim;
    s.QL = m.q_lora_rank;
  }
  // The store must be laid out for this config: same names, same shapes.
  const std::vector<ParamSpec> want = s.net.parameter_layout();
  if (want.size() != params.size())
    throw Error("decoder: the parameter store has " + std::to_string(params.size()) +
                " tensors, the model config " + std::to_string(want.size()));
  for (const ParamSpec& w : want) {
    const ParamSpec& have = params.spec(params.index_of(w.name));
    if (have.shape != w.shape)
      throw Error("decoder: parameter " + w.name + " has shape " + have.shape.str() +
                  ", the model config " + w.shape.str());
  }
  s.net.bind(params);
  s.take_all();  // layout pass
  s.arena = Arena("decoder", Arena::Mode::allocate, s.arena.used_bytes());
  s.take_all();
  s.rope.fill(s.c.ctx, m.rope_theta, m.rope_scaling);
}

Decoder::~Decoder() = default;

std::int64_t Decoder::cache_values() const {
  const Impl& s = *impl_;
  const std::int64_t n =
      s.mla ? s.latent_cache.numel() + s.k_pe_cache.numel() : s.k_cache.numel() + s.v_cache.numel();
  return n / (s.L * s.S);
}

std::int64_t Decoder::cache_values_per_token(const config::ModelSection& m) {
  return m.mla() ? m.kv_lora_rank + m.qk_rope_head_dim : 2 * m.n_kv_heads * (m.d_model / m.n_heads);
}

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
  s.net.embedding().forward(s.c, rows(s.tokens, n), rows(s.x, n));
  const BlockActs a = s.block_rows(n);
  for (std::int64_t l = 0; l < s.L; ++l) {
    if (s.mla) {
      const LatentKVCache cache = s.latent(l, p0);
      s.net.block(l).forward(s.c, s.rope, 1, n, a, a.x, nullptr, &cache);
    } else {
      const KVCache cache = s.cache(l, p0);
      s.net.block(l).forward(s.c, s.rope, 1, n, a, a.x, &cache);
    }
  }
  s.pos += n;
  // Only the rows whose logits are wanted go through the final norm and the head.
  const std::int64_t first = all_logits ? 0 : n - 1;
  const std::int64_t m = n - first;
  const Tensor out = rows(s.logits, m);
  s.net.head().forward(s.c, row_range(s.x, first, m), RmsNormActs{rows(s.ln, m), rows(s.rstd, m)},
                       out);
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
