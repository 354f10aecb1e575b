#include "plan_text.hpp"

#include <cstdio>
#include <string>

namespace dst::app {

using model::format_bytes;
using model::format_count;

std::string format_plan(const config::RunConfig& c, const config::Layout& layout,
                        const train::Plan& plan, std::uint64_t available_per_rank) {
  std::string out;
  char line[512];
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
          (p.head ? format_count(static_cast<double>(p.head)) : std::string("tied")) +
          (p.mtp ? ", MTP module " + format_count(static_cast<double>(p.mtp)) : std::string()) +
          ")");
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
  if (plan.recompute_flops_per_token > 0)
    row("recompute FLOPs", format_count(plan.recompute_flops_per_token),
        "per token (training.recompute " + to_string(c.training.recompute) + "; not model FLOPs)");
  const auto& m = plan.memory;
  const auto bytes = [](std::uint64_t b) { return format_bytes(static_cast<double>(b)); };
  const int z = plan.options.zero_stage;
  // ZeRO: the heaviest rank's shard (shards of whole tensors are not all equal).
  const std::string by_data = ", the largest of " + std::to_string(layout.data) + " shards";
  row("memory per rank", bytes(m.total()),
      "(precision " + to_string(c.training.precision) + ", zero stage " + std::to_string(z) +
          ", recompute " + to_string(c.training.recompute) + ")");
  const bool low = c.training.precision != config::Precision::fp32;
  row("  parameters", bytes(m.parameters), low ? "(16-bit compute copy)" : "(fp32)");
  if (low) row("  master weights", bytes(m.master), z >= 1 ? "(fp32" + by_data + ")" : "(fp32)");
  row("  gradients", bytes(m.gradients),
      m.gradients < m.parameters * (low ? 2 : 1) ? "(fp32" + by_data + ")" : "(fp32)");
  row("  optimizer state", bytes(m.optimizer),
      z >= 1 ? "(AdamW moments, fp32" + by_data + ")" : "(AdamW moments, fp32)");
  row("  activations", bytes(m.activations),
      plan.stages.empty() ? "(one micro-batch, kept for backward)"
                          : "(the micro-batches in flight, kept for backward)");
  if (m.recompute > 0)
    row("  recomputed", bytes(m.recompute), "(one block's share, refilled in backward)");
  row("  workspace", bytes(m.workspace), "(backward scratch, RoPE tables)");
  // The heaviest stage's sends in flight (plan.memory is that stage's).
  const std::int64_t sends =
      plan.heaviest_stage >= 0
          ? plan.stages.at(static_cast<std::size_t>(plan.heaviest_stage)).sends_in_flight
          : 0;
  const bool buckets = m.comm > static_cast<std::uint64_t>(sends) *
                                    static_cast<std::uint64_t>(plan.p2p_bytes_per_micro_batch);
  const std::string sent = std::to_string(sends) + " pipeline message copies in flight";
  row("  communication", bytes(m.comm),
      buckets ? (sends > 0 ? "(two gradient buckets and " + sent + ")"
                           : std::string("(two gradient buckets in flight)"))
              : (sends > 0 ? "(" + sent + ")" : "(none: one data rank or the shared sum)"));
  if (!plan.stages.empty()) {
    char frac[64];
    std::snprintf(frac, sizeof frac, "%.3f", plan.bubble_fraction);
    const std::string V = std::to_string(plan.chunks);
    row("pipeline", std::to_string(plan.stages.size()) + " stages",
        plan.chunks > 1 ? "(interleaved, " + V + " chunks per rank, over " +
                              std::to_string(layout.grad_accum_steps) +
                              " micro-batches; bubble (P - 1) / (V m) = " + frac +
                              "; memory per rank above: the heaviest stage)"
                        : "(1f1b over " + std::to_string(layout.grad_accum_steps) +
                              " micro-batches; bubble (P - 1) / m = " + frac +
                              "; memory per rank above: the heaviest stage)");
    for (std::size_t s = 0; s < plan.stages.size(); ++s) {
      const train::Plan::Stage& st = plan.stages[s];
      std::string what;
      for (const auto& [first, last] : st.chunks)
        what += (what.empty() ? "blocks " : ", ") + std::to_string(first) +
                (last - 1 > first ? "-" + std::to_string(last - 1) : std::string());
      if (st.embedding) what = "embedding, " + what;
      if (st.embedding_copy) what = "copy of the embedding, " + what;
      if (st.head) what += ", final norm, head, loss";
      row(("  stage " + std::to_string(s)).c_str(), bytes(st.memory.total()),
          "(" + what + "; " + format_count(static_cast<double>(st.parameters)) +
              " parameters; activations " + bytes(st.memory.activations) + " for " +
              std::to_string(st.in_flight) +
              (plan.chunks > 1 ? " records (micro-batches in flight, summed over its chunks))"
                               : " micro-batch(es) in flight)"));
    }
    row("point-to-point", format_bytes(plan.p2p_bytes_per_micro_batch),
        "per micro-batch and stage boundary, each way (activations forward, their gradient "
        "backward; fp32)");
    if (plan.embedding_sum_bytes > 0)
      row("embedding group", format_bytes(plan.embedding_sum_bytes),
          "per step, each way between stage 0 and stage " + std::to_string(plan.stages.size() - 1) +
              " (the embedding table's gradient: " +
              (c.model.tie_embeddings ? "tied to the head" : "read by the MTP module") +
              " on the last stage, which holds a copy)");
  }
  char factor[32];
  std::snprintf(factor, sizeof factor, "%g", c.model.moe.capacity_factor);
  const auto plural = [](std::int64_t n, const char* one, const char* many) {
    return std::to_string(n) + " " + (n == 1 ? one : many);
  };
  if (plan.expert_capacity >= 0)
    row("expert capacity", std::to_string(plan.expert_capacity) + " rows",
        std::string("per expert and micro-batch of a rank (model.moe.capacity_factor ") + factor +
            " x " + std::to_string(c.training.micro_batch_size * c.data.seq_len) +
            " tokens x top-" + std::to_string(c.model.num_experts_per_tok) + " / " +
            std::to_string(c.model.n_routed_experts) +
            " experts); the rows of the lowest scores beyond it are dropped");
  if (plan.token_nodes > 0) {
    row("node-limited routing", "<= " + plural(plan.token_nodes, "node", "nodes"),
        "a token's rows reach (model.moe.max_nodes_per_token " +
            std::to_string(c.model.moe.max_nodes_per_token) + "; the routed experts lie on " +
            plural(plan.expert_nodes, "node", "nodes") +
            (c.debug.expert_nodes > 0 ? ", debug.expert_nodes"
                                      : ", ranks per node of '" + plan.options.host + "'") +
            ")");
    if (plan.cross_node_bytes_per_moe_layer > 0)
      row("  cross-node all-to-all", format_bytes(plan.cross_node_bytes_per_moe_layer),
          "per rank, step and MoE layer as sent (every row; (n-1)/n of them at balanced load); "
          "a dispatch sending a token once per node would send <= " +
              format_bytes(plan.cross_node_dedup_bound_per_moe_layer) + " (" +
              plural(plan.token_nodes, "copy", "copies") + " of a token)");
  }
  row("available per rank",
      available_per_rank ? format_bytes(static_cast<double>(available_per_rank)) : "unknown", "");
  for (const train::CollectiveVolume& v : plan.collectives)
    row("communication", format_bytes(v.bytes_per_rank),
        "per rank and step: " + v.what +
            (v.what.rfind("all-to-all", 0) == 0
                 ? " (a layer's rows of one micro-batch: " + format_bytes(v.buffer_bytes) + ")"
                 : " of " + format_bytes(v.buffer_bytes) + " (ring)"));
  const train::HostRates& r = train::host_rates(plan.options.host);
  char time[160];
  std::snprintf(time, sizeof(time), "%.3g s", plan.step.total_s());
  char note[256];
  std::snprintf(note, sizeof(note),
                "(compute %.3g s at %.0f GFLOP/s + communication %.3g s at %.3g GB/s, not "
                "overlapped; rates '%s')",
                plan.step.compute_s, low ? r.gemm_16bit_gflops : r.gemm_fp32_gflops,
                plan.step.comm_s,
                static_cast<std::int64_t>(layout.data) > r.ranks_per_node && r.inter_node_gbs > 0
                    ? r.inter_node_gbs
                    : r.intra_node_gbs,
                r.kind.c_str());
  row("step time", time, note);
  return out;
}

}  // namespace dst::app
