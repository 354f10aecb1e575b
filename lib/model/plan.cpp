#include "model/plan.hpp"

#include "core/error.hpp"
#include "model/dense_model.hpp"

#include <cstdio>

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
  p.final_norm = C;
  p.head = m.tie_embeddings ? 0 : m.vocab_size * C;  // (V, C)
  return p;
}

double training_flops_per_token(const config::ModelSection& m, std::int64_t seq_len) {
  const ParamCount p = count_parameters(m);
  // The project's one definition of model FLOPs (MFU uses it): 6 FLOPs per active
  // non-embedding parameter per token (a multiply-add forward, two backward), output head
  // included even when it is tied to the embedding, plus attention scores and values.
  const double non_embedding = static_cast<double>(p.active() - p.embedding) +
                               (m.tie_embeddings ? static_cast<double>(p.embedding) : 0.0);
  // Widths of all heads' queries/keys and values: d_model each for dense attention.
  const double qk_width =
      m.mla() ? static_cast<double>(m.n_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim))
              : static_cast<double>(m.d_model);
  const double v_width =
      m.mla() ? static_cast<double>(m.n_heads * m.v_head_dim) : static_cast<double>(m.d_model);
  const double attention =
      6.0 * static_cast<double>(m.n_layers) * static_cast<double>(seq_len) * (qk_width + v_width);
  return 6.0 * non_embedding + attention;
}

Plan make_plan(const config::RunConfig& c, const config::Layout& layout) {
  const auto& m = c.model;
  Plan plan;
  plan.params = count_parameters(m);
  const std::int64_t T = c.data.seq_len;
  plan.flops_per_token = training_flops_per_token(m, T);
  plan.tokens_per_step = layout.global_batch_size * T;
  plan.flops_per_step = plan.flops_per_token * static_cast<double>(plan.tokens_per_step);

  // The layout pass: the model's own constructor, in planning mode, takes every buffer
  // it would allocate for a micro-batch and allocates nothing.
  const DenseModel model(m, c.training.micro_batch_size, T, tensor::Arena::Mode::plan);
  if (model.params().parameter_count() != plan.params.total())
    throw Error("plan: the model's layout has " + std::to_string(model.params().parameter_count()) +
                " parameters but the closed form gives " + std::to_string(plan.params.total()));
  const ModelMemory mm = model.memory();

  // Every rank holds the whole model: data-parallel ranks are replicas, and tensor and
  // pipeline parallelism, which would split it, are not implemented (the deck refuses
  // them, issue 31).
  const bool low_precision = c.training.precision != config::Precision::fp32;
  auto& mem = plan.memory;
  // fp32 master weights, plus a 16-bit compute copy in bf16/fp16 runs.
  mem.parameters = mm.parameters + (low_precision ? mm.parameters / 2 : 0);
  mem.gradients = mm.gradients;
  mem.optimizer = 2 * mm.parameters;  // AdamW first and second moments, fp32
  mem.activations = mm.activations;
  // Backward scratch plus two gradient all-reduce buckets in flight.
  const auto bucket = static_cast<std::uint64_t>(c.parallel.bucket_mb * 1024 * 1024);
  mem.workspace = mm.workspace + (layout.data > 1 ? 2 * bucket : 0);

  // Ring all-reduce moves 2 (p-1)/p of the gradient bytes per rank (fp32 gradients).
  const double p = layout.data;
  plan.comm_bytes_per_step = p > 1 ? 2.0 * (p - 1) / p * static_cast<double>(mm.gradients) : 0.0;
  return plan;
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

namespace dst::model {

std::string format_plan(const config::RunConfig& c, const config::Layout& layout, const Plan& plan,
                        std::uint64_t available_per_rank) {
  std::string out;
  char line[256];
  auto row = [&](const char* name, const std::string& value, const std::string& note) {
    std::snprintf(line, sizeof(line), "  %-22s %-12s %s", name, value.c_str(), note.c_str());
    std::string text = line;
    text.erase(text.find_last_not_of(' ') + 1);
    out += text + "\n";
  };
  const auto& p = plan.params;
  out += "plan: model '" + c.model.preset + "' (d_model " + std::to_string(c.model.d_model) + ", " +
         std::to_string(c.model.n_layers) + " layers, vocab " + std::to_string(c.model.vocab_size) +
         ") on " + std::to_string(layout.world_size) + " rank(s): data " +
         std::to_string(layout.data) + " x tensor " + std::to_string(layout.tensor) +
         " x pipeline " + std::to_string(layout.pipeline) + "\n";
  row("parameters", format_count(static_cast<double>(p.total())),
      "(" + std::to_string(p.total()) + ": embedding " +
          format_count(static_cast<double>(p.embedding)) + ", " +
          std::to_string(c.model.n_layers - p.moe_layers) + " x " +
          format_count(static_cast<double>(p.per_layer)) +
          (p.moe_layers > 0 ? " per dense layer" : " per layer") + ", head " +
          (p.head ? format_count(static_cast<double>(p.head)) : std::string("tied")) + ")");
  if (p.moe_layers > 0)
    row("active parameters", format_count(static_cast<double>(p.active())),
        "(" + std::to_string(p.active()) + " per token: " + std::to_string(p.moe_layers) +
            " MoE blocks of " + format_count(static_cast<double>(p.per_moe_layer)) + ", " +
            format_count(static_cast<double>(p.per_moe_layer_active)) + " active; top-" +
            std::to_string(c.model.num_experts_per_tok) + " of " +
            std::to_string(c.model.n_routed_experts) + " routed experts)");
  row("FLOPs per token", format_count(plan.flops_per_token),
      p.moe_layers > 0 ? "(training: forward + backward, active parameters)"
                       : "(training: forward + backward)");
  row("tokens per step", std::to_string(plan.tokens_per_step),
      "(global batch " + std::to_string(layout.global_batch_size) + " x seq_len " +
          std::to_string(c.data.seq_len) + "; micro-batch " +
          std::to_string(c.training.micro_batch_size) + " x " +
          std::to_string(layout.grad_accum_steps) + " accumulation step(s) per rank)");
  row("FLOPs per step", format_count(plan.flops_per_step), "");
  const auto& m = plan.memory;
  row("memory per rank", format_bytes(static_cast<double>(m.total())),
      "(precision " + to_string(c.training.precision) + ")");
  row("  parameters", format_bytes(static_cast<double>(m.parameters)), "");
  row("  gradients", format_bytes(static_cast<double>(m.gradients)), "");
  row("  optimizer state", format_bytes(static_cast<double>(m.optimizer)), "(AdamW moments, fp32)");
  row("  activations", format_bytes(static_cast<double>(m.activations)),
      "(one micro-batch, kept for backward)");
  row("  workspace", format_bytes(static_cast<double>(m.workspace)), "");
  row("available per rank",
      available_per_rank ? format_bytes(static_cast<double>(available_per_rank)) : "unknown", "");
  row("all-reduce per step", format_bytes(plan.comm_bytes_per_step),
      "(data-parallel gradients, ring estimate, per rank)");
  return out;
}

}  // namespace dst::model
