#include "model/plan.hpp"

#include "model/layers/moe_router.hpp"

#include "core/error.hpp"
#include "model/language_model.hpp"

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace dst::model {

namespace {
/// Attention parameters of one block: MHA/GQA, or multi-head latent attention.
std::int64_t attention_parameters(const config::ModelSection& m) {
  const std::int64_t C = m.d_model, H = m.n_heads;
  if (m.mla()) {
    const std::int64_t qk = m.qk_nope_head_dim + m.qk_rope_head_dim;  // per-head q/k width
    const std::int64_t q = m.q_lora_rank > 0
                               ? m.q_lora_rank * C                     // q_a_proj (q_lora, C)
                                     + m.q_lora_rank                   // q_a_layernorm
                                     + H * qk * m.q_lora_rank          // q_b_proj (H*qk, q_lora)
                               : H * qk * C;                           // q_proj (H*qk, C)
    return q + (m.kv_lora_rank + m.qk_rope_head_dim) * C               // kv_a_proj_with_mqa
           + m.kv_lora_rank                                            // kv_a_layernorm
           + H * (m.qk_nope_head_dim + m.v_head_dim) * m.kv_lora_rank  // kv_b_proj
           + C * H * m.v_head_dim;                                     // o_proj
  }
  const std::int64_t hd = C / H;              // head dimension
  const std::int64_t kv = m.n_kv_heads * hd;  // width of K and V (GQA: < C)
  return C * C                                // wq (C, C)
         + 2 * C * kv                         // wk, wv (kv, C)
         + C * C;                             // wo (C, C)
}
}  // namespace

ParamCount count_parameters(const config::ModelSection& m) {
  const std::int64_t C = m.d_model;
  ParamCount p;
  p.embedding = m.vocab_size * C;  // (V, C)
  const std::int64_t attn = attention_parameters(m);
  const std::int64_t norms = 2 * C;                // attention and MLP RMSNorm weights
  p.per_layer = attn + 3 * C * m.ffn_dim + norms;  // w1, w3 (F, C); w2 (C, F)
  std::int64_t dense_layers = m.n_layers;
  if (m.n_routed_experts > 0) {
    const std::int64_t E = m.n_routed_experts;
    const std::int64_t expert = 3 * C * m.moe_intermediate_size;  // one SwiGLU expert
    const std::int64_t bias = m.moe.score == config::MoeScore::sigmoid ? E : 0;
    const std::int64_t shared = m.n_shared_experts * expert;  // one wider SwiGLU
    p.per_moe_layer = attn + norms + E * C /* router (E, C) */ + bias + shared + E * expert;
    p.per_moe_layer_active = p.per_moe_layer - bias - (E - m.num_experts_per_tok) * expert;
    p.moe_layers = m.n_layers - m.first_k_dense_replace;
    dense_layers = m.first_k_dense_replace;
  }
  p.layers = p.per_layer * dense_layers + p.per_moe_layer * p.moe_layers;
  if (m.mtp_depth > 0) {
    // Its block is the last block's kind (model.layers.<n_layers>: an MoE block whenever
    // the model has DeepSeekMoE, as first_k_dense_replace < n_layers).
    const bool moe = m.n_routed_experts > 0;
    const std::int64_t own = 3 * C /* enorm, hnorm, shared_head.norm */ + 2 * C * C /* eh_proj */;
    p.mtp = m.mtp_depth * (own + (moe ? p.per_moe_layer : p.per_layer));
    p.mtp_active = m.mtp_depth * (own + (moe ? p.per_moe_layer_active : p.per_layer));
  }
  p.final_norm = C;
  p.head = m.tie_embeddings ? 0 : m.vocab_size * C;  // (V, C)
  return p;
}

namespace {
/// Widths of all heads' queries/keys and values: d_model each for dense attention, the
/// latent attention's head dims times the heads with MLA.
struct AttentionWidths {
  double qk, v;
};
AttentionWidths attention_widths(const config::ModelSection& m) {
  if (m.mla())
    return {static_cast<double>(m.n_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim)),
            static_cast<double>(m.n_heads * m.v_head_dim)};
  return {static_cast<double>(m.d_model), static_cast<double>(m.d_model)};
}
}  // namespace

double training_flops_per_token(const config::ModelSection& m, std::int64_t seq_len) {
  const ParamCount p = count_parameters(m);
  // The project's one definition of model FLOPs (MFU uses it): 6 FLOPs per active
  // non-embedding parameter per token (a multiply-add forward, two backward), output head
  // included even when it is tied to the embedding, plus attention scores and values.
  // The MTP module runs the shared output projection a second time (V x C each).
  const double non_embedding = static_cast<double>(p.active() - p.embedding) +
                               (m.tie_embeddings ? static_cast<double>(p.embedding) : 0.0) +
                               static_cast<double>(m.mtp_depth * m.vocab_size * m.d_model);
  const AttentionWidths w = attention_widths(m);
  const double attention = 6.0 * static_cast<double>(m.n_layers + m.mtp_depth) *
                           static_cast<double>(seq_len) * (w.qk + w.v);
  return 6.0 * non_embedding + attention;
}

double recompute_flops_per_token(const config::ModelSection& m, std::int64_t seq_len,
                                 config::Recompute recompute) {
  // The MTP module's block is recomputed like the model's.
  const double L = static_cast<double>(m.n_layers + m.mtp_depth), T = static_cast<double>(seq_len);
  const AttentionWidths w = attention_widths(m);
  switch (recompute) {
    case config::Recompute::none:
      return 0.0;
    case config::Recompute::selective:  // the scores q k^T again: 2 T qk per token and layer
      return 2.0 * L * T * w.qk;
    case config::Recompute::full: {  // the blocks' forward again: a third of their training
      const ParamCount p = count_parameters(m);
      // A token runs its top-k routed experts only: the blocks' active parameters.
      const bool mtp_moe = m.n_routed_experts > 0;
      const double active_layers = static_cast<double>(
          p.per_layer * (m.n_layers - p.moe_layers) + p.per_moe_layer_active * p.moe_layers +
          m.mtp_depth * (mtp_moe ? p.per_moe_layer_active : p.per_layer));
      return 2.0 * active_layers + 2.0 * L * T * (w.qk + w.v);
    }
  }
  return 0.0;
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 5) {
    bytes /= 1024.0;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
  return buf;
}

std::string format_count(double n) {
  const char* units[] = {"", " K", " M", " B", " T"};
  int u = 0;
  while (n >= 1000.0 && u < 4) {
    n /= 1000.0;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f%s" : "%.3g%s", n, units[u]);
  return buf;
}

}  // namespace dst::model
