#pragma once
/// \file plan.hpp
/// What a model costs from its config alone: the parameter count by group and the
/// training FLOPs per token (the MFU definition), closed forms of the DeepSeek-LLM,
/// DeepSeek-V2/V3 decoders that the model's layout pass is tested against; and the
/// human-readable byte and count formats. The memory and communication a run needs per
/// rank is train::make_plan's (train/plan.hpp), computed with the run's own rules.

#include <cstdint>
#include <string>
#include <utility>
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
  /// The multi-token prediction module (model.mtp_depth 1; 0 without): enorm, hnorm and
  /// shared_head.norm (3 C), eh_proj (C, 2C) and one block of the model's last block's kind
  /// (per_moe_layer or per_layer). Its embedding and output projection are the model's.
  std::int64_t mtp = 0;
  /// What one token uses of it: mtp less, for an MoE block, the skipped experts and the bias.
  std::int64_t mtp_active = 0;
  /// Every parameter of the layout (the routers' e_score_correction_bias included: it is
  /// stored with the parameters, but moved by the balancing rule, not by gradients).
  std::int64_t total() const { return embedding + layers + final_norm + head + mtp; }
  /// The parameters one token's forward uses: total() less, in each MoE block, the routed
  /// experts it is not sent to and the correction bias. total() for a dense model.
  std::int64_t active() const {
    return total() - moe_layers * (per_moe_layer - per_moe_layer_active) - (mtp - mtp_active);
  }
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
/// active: router, shared and top-k routed experts), not the experts it skips. The
/// multi-token prediction module (model.mtp_depth 1) is model computation too: its
/// parameters (in active()), the shared output head's second product (V x C more) and its
/// block's attention (n_layers + 1 blocks of attention).
double training_flops_per_token(const config::ModelSection& m, std::int64_t seq_len);

/// FLOPs per token training.recompute adds to the training FLOPs (see Plan).
double recompute_flops_per_token(const config::ModelSection& m, std::int64_t seq_len,
                                 config::Recompute recompute);

/// Human-readable bytes ("1.50 GiB").
std::string format_bytes(double bytes);
/// Human-readable count ("6.91 B", "12.3 M").
std::string format_count(double n);

}  // namespace dst::model
