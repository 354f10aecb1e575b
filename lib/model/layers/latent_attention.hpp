#pragma once
/// \file latent_attention.hpp
/// Multi-head latent attention (DeepSeek-V2, section 2.1; DeepSeek-V3), as transformers'
/// DeepseekV3Attention with rope_scaling None:
///   q            = x Wq^T, or q_b(RMSNorm(q_a(x))) with a query latent (q_lora_rank > 0)
///   [c_kv | k_pe] = kv_a_proj_with_mqa(x);   c_kv normalised (kv_a_layernorm)
///   [k_nope | v] = kv_b_proj(RMSNorm(c_kv)) per head; k_pe one RoPE key shared by heads
///   head h: softmax((q_nope k_nope^T + q_pe k_pe^T) / sqrt(nope + rope)) v;  o_proj
/// RoPE rotates interleaved pairs of the rope columns (kernels::rope_interleaved_forward,
/// which says how this matches transformers' rope_interleave). The scores are the sum of
/// two products, so the per-head keys [k_nope | k_pe] are never assembled. The unfused
/// attention core only (grouped as kernels::attention_grouping says).
///
/// Decoding (LatentKVCache) caches what DeepSeek-V2 section 2.1.2 caches: per token the
/// normalised latent (kv_lora) and the rotated RoPE key (rope), kv_lora + rope values per
/// layer (576 for V3's shape) instead of 2 x H x head dims. The per-head keys and values
/// are never expanded: kv_b_proj's key rows are absorbed into the query (q_nope W_UK, a
/// kv_lora-wide query per head) and its value rows applied after the probabilities (the
/// weighted sum of latents, then W_UV), the same products in another association.
///
/// Tensor parallelism (parallel.tensor T, tensor_parallel.hpp): each rank holds H / T heads:
/// q_proj or q_b_proj and kv_b_proj by their heads' output rows, o_proj by their input
/// columns, whose output is a partial sum over the group as in standard attention. The
/// latents' projections and norms (q_a_proj, q_a_layernorm, kv_a_proj_with_mqa,
/// kv_a_layernorm) are replicated: every rank computes the same latents. In backward their
/// gradients (d of the normalised latents, d of the RoPE key) arrive as each rank's heads'
/// shares; one all-reduce over the group makes them whole (q_lora + kv_lora + rope floats
/// per token and layer), so the replicated weights' gradients are the same on every rank
/// from the start (as the shared key/value heads of standard attention), and their input
/// gradient, whole on every rank, is added by the group's first rank only before the
/// group's sum of the input gradient.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "config/run_config.hpp"
#include "model/layers/attention.hpp"
#include "model/layers/layer.hpp"
#include "model/layers/rmsnorm.hpp"
#include "tensor/arena.hpp"

namespace dst::model {

/// What latent attention keeps from forward for backward (with its input). N = B*T.
struct LatentAttentionActs {
  RmsNormActs q_norm;    // (N, q_lora), (N) with a query latent
  tensor::Tensor q_a;    // (N, q_lora) q_a_proj(x), with a query latent
  tensor::Tensor q;      // (N, H*(nope+rope)) per head [q_nope | q_pe], q_pe after RoPE
  tensor::Tensor c_kv;   // (N, kv_lora) the key/value latent before its norm
  RmsNormActs kv_norm;   // (N, kv_lora), (N)
  tensor::Tensor k_pe;   // (N, rope) the shared RoPE key, after RoPE
  tensor::Tensor kv;     // (N, H*(nope+v)) per head [k_nope | v]
  tensor::Tensor probs;  // (B, H, T, T)
  tensor::Tensor attn;   // (N, H*v) the heads' output, before o_proj
};

/// Decoding's cache of one layer: the rows [0, position) hold earlier tokens; a forward of
/// T tokens writes rows [position, position + T).
struct LatentKVCache {
  tensor::Tensor latent;  // (capacity, kv_lora) kv_a_layernorm(c_kv)
  tensor::Tensor k_pe;    // (capacity, rope) the shared RoPE key, after RoPE
  tensor::Tensor q_lat;   // (T, kv_lora) scratch: one head's absorbed query
  tensor::Tensor o_lat;   // (T, kv_lora) scratch: one head's weighted sum of latents
  tensor::Tensor scores;  // (T, capacity) scratch: one head's scores, then probabilities
  std::int64_t position = 0;
};

/// Backward scratch, shared by every latent attention layer of the model.
struct LatentAttentionScratch {
  tensor::Tensor d_attn;   // (N, H*v)
  tensor::Tensor d_probs;  // (B, H, T, T)
  tensor::Tensor d_q;      // (N, H*(nope+rope))
  tensor::Tensor d_kv;     // (N, H*(nope+v))
  tensor::Tensor d_k_pe;   // (N, rope)
  tensor::Tensor d_kv_n;   // (N, kv_lora) gradient of the normalised latent
  tensor::Tensor d_c_kv;   // (N, kv_lora)
  tensor::Tensor d_q_n;    // (N, q_lora) with a query latent
  tensor::Tensor d_q_a;    // (N, q_lora)
};

class LatentAttention {
 public:
  /// `prefix`: the parameter names' ("model.layers.0.self_attn."); the shape from `m`
  /// (d_model, n_heads, q_lora_rank, kv_lora_rank, the head dims). `out_std`: o_proj's
  /// initial standard deviation.
  /// `tensor_parallel` T: this rank's H / T heads (see the file comment; T must divide
  /// n_heads).
  LatentAttention(std::string prefix, const config::ModelSection& m, float out_std,
                  int tensor_parallel = 1);

  /// In transformers' order: q_proj (H*qk, C) or q_a_proj (q_lora, C), q_a_layernorm,
  /// q_b_proj (H*qk, q_lora); kv_a_proj_with_mqa (kv_lora + rope, C), kv_a_layernorm,
  /// kv_b_proj (H*(nope+v), kv_lora); o_proj (C, H*v). Per-head products split by columns
  /// (heads), o_proj by rows; the latents' projections and norms are replicated.
  void declare(std::vector<ParamSpec>& specs) const;
  void bind(const ParamStore& params);
  /// The RoPE tables' head dim: qk_rope_head_dim.
  std::int64_t rope_dim() const { return rope_; }

  /// `keep_probs`: false under selective recompute (the probabilities are a shared
  /// buffer, Block::take_shared, refilled by recompute_probs).
  LatentAttentionActs take(tensor::Arena& arena, std::int64_t B, std::int64_t T,
                           bool keep_probs = true) const;
  /// The (B, H, T, T) attention probabilities' buffer.
  tensor::Tensor take_probs(tensor::Arena& arena, std::int64_t B, std::int64_t T) const;
  LatentAttentionScratch take_scratch(tensor::Arena& arena, std::int64_t B, std::int64_t T) const;

  /// out (N, C) = o_proj(attention(x)) for x (N, C) of B sequences of T tokens at positions
  /// 0 .. T-1 (`rope`: tables of rope_dim()); keeps a. With `cache` (decoding, B = 1, on
  /// the host): the T tokens are at positions cache->position .. + T - 1 and attend to the
  /// cached ones too; their latents and RoPE keys go into the cache (a.kv_norm.out,
  /// a.k_pe and a.probs, a.kv are not used).
  void forward(const Compute& c, const Rope& rope, std::int64_t B, std::int64_t T,
               const tensor::Tensor& x, const LatentAttentionActs& a, const tensor::Tensor& out,
               const LatentKVCache* cache = nullptr) const;
  /// a.probs as forward computed them, from the kept a.q, a.kv and a.k_pe (the same
  /// operations, so the same bits): selective recompute's refill before backward.
  void recompute_probs(const Compute& c, std::int64_t B, std::int64_t T,
                       const LatentAttentionActs& a) const;
  /// dx (N, C) = d(loss)/dx (written) from dout (N, C), which is rounded in place to the
  /// storage type; accumulates the weights' gradients.
  void backward(const Compute& c, const Rope& rope, std::int64_t B, std::int64_t T,
                const tensor::Tensor& dout, const tensor::Tensor& x, const LatentAttentionActs& a,
                const LatentAttentionScratch& s, const tensor::Tensor& dx) const;

 private:
  /// a.probs and, with `heads_out`, a.attn from a.q, a.kv and a.k_pe.
  void core_forward(const Compute& c, std::int64_t B, std::int64_t T, const LatentAttentionActs& a,
                    bool heads_out) const;
  void core_backward(const Compute& c, std::int64_t B, std::int64_t T, const LatentAttentionActs& a,
                     const LatentAttentionScratch& s) const;
  /// a.attn of T cached-path rows from a.q and the cache (absorbed products, see the file).
  void cached_core(const Compute& c, std::int64_t T, const LatentAttentionActs& a,
                   const LatentKVCache& cache) const;

  std::string prefix_;
  std::int64_t C_, H_, q_lora_, kv_lora_, nope_, rope_, v_;  ///< H_: this rank's heads
  int tp_ = 1;
  float out_std_;
  float scale_;  // 1 / sqrt(nope + rope)
  RmsNorm q_norm_, kv_norm_;
  std::size_t q_ = 0, q_a_ = 0, q_b_ = 0, kv_a_ = 0, kv_b_ = 0, o_ = 0;
};

}  // namespace dst::model
