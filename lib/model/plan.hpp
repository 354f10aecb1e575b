#pragma once
/// \file plan.hpp
/// The cost of a run from the model config alone, without allocating: parameter count,
/// training FLOPs per token, and memory per rank. These are the closed-form formulas of
/// the DeepSeek-LLM (Llama-style) dense decoder; the model layer's layout pass will be
/// tested against them.

#include <cstdint>
#include <string>
#include <vector>

#include "config/run_config.hpp"

namespace dst::model {

/// Parameter counts by group. An MoE model (model.n_routed_experts > 0) has two block
/// kinds: the first first_k_dense_replace blocks with the dense MLP, the rest with
/// DeepSeekMoE, of which a token uses only the shared and its top-k routed experts.
struct ParamCount {
  std::int64_t embedding = 0;      ///< (V, C) token embedding
  std::int64_t per_layer = 0;      ///< attention + dense MLP + 2 RMSNorm weights of a block
  std::int64_t per_moe_layer = 0;  ///< attention + MoE + 2 norms of an MoE block (0: dense)
  /// What one token uses of an MoE block: per_moe_layer less the routed experts it skips
  /// (n_routed - top-k) and the router's correction bias (not a product).
  std::int64_t per_moe_layer_active = 0;
  std::int64_t moe_layers = 0;  ///< blocks with DeepSeekMoE
  std::int64_t layers = 0;      ///< per_layer x dense blocks + per_moe_layer x moe_layers
  std::int64_t final_norm = 0;  ///< (C)
  std::int64_t head = 0;        ///< (V, C) output head; 0 when tied to the embedding
  /// Every parameter of the layout (the routers' e_score_correction_bias included: it is
  /// stored with the parameters, but moved by the balancing rule, not by gradients).
  std::int64_t total() const { return embedding + layers + final_norm + head; }
  /// The parameters one token's forward uses: total() less, in each MoE block, the routed
  /// experts it is not sent to and the correction bias. total() for a dense model.
  std::int64_t active() const {
    return total() - moe_layers * (per_moe_layer - per_moe_layer_active);
  }
};

/// Memory one rank needs, in bytes.
struct MemoryPlan {
  std::uint64_t parameters = 0;   ///< fp32 master weights (+ bf16/fp16 compute copy)
  std::uint64_t gradients = 0;    ///< fp32 gradient buffer
  std::uint64_t optimizer = 0;    ///< AdamW first and second moments, fp32
  std::uint64_t activations = 0;  ///< kept for backward, one micro-batch (layout pass)
  std::uint64_t workspace = 0;    ///< backward scratch (layout pass) + all-reduce buckets
  std::uint64_t total() const {
    return parameters + gradients + optimizer + activations + workspace;
  }
};

struct Plan {
  ParamCount params;
  double flops_per_token = 0;  ///< training (forward + backward) FLOPs per token
  double flops_per_step = 0;   ///< flops_per_token * tokens per optimizer step
  std::int64_t tokens_per_step = 0;
  MemoryPlan memory;               ///< per rank
  double comm_bytes_per_step = 0;  ///< data-parallel gradient all-reduce, per rank
};

/// Parameter count of the model section.
ParamCount count_parameters(const config::ModelSection& m);

/// Model FLOPs per token of training, the one definition MFU uses everywhere:
/// 6 x (active non-embedding parameters, output head included) + 6 x n_layers x seq_len x
/// (query-key width + value width of all heads) for attention scores and values (PaLM
/// appendix B; the causal mask's skipped half is counted, so MFU figures compare with
/// published ones). Dense attention: both widths are d_model, 12 x L x T x C. Multi-head
/// latent attention: H x (qk_nope + qk_rope) and H x v_head_dim, as the expanded heads
/// compute them in training. An MoE block counts the parameters a token uses (ParamCount::
/// active: router, shared and top-k routed experts), not the experts it skips.
double training_flops_per_token(const config::ModelSection& m, std::int64_t seq_len);

/// The whole plan for a config on a layout. Memory comes from a layout-only pass of the
/// real model (DenseModel in planning mode), so it is what a run would allocate.
Plan make_plan(const config::RunConfig& c, const config::Layout& layout);

/// Human-readable bytes ("1.50 GiB").
std::string format_bytes(double bytes);
/// Human-readable count ("6.91 B", "12.3 M").
std::string format_count(double n);

}  // namespace dst::model

namespace dst::model {
/// The plan as the fixed-format table `dstrain check` prints. `available_per_rank` (0 =
/// unknown) is the memory a rank may use on the device it runs on.
std::string format_plan(const config::RunConfig& c, const config::Layout& layout, const Plan& plan,
                        std::uint64_t available_per_rank);
}  // namespace dst::model
