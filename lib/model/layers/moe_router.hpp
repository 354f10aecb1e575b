#pragma once
/// \file moe_router.hpp
/// DeepSeekMoE's router and token bookkeeping, as plain host functions over row-major
/// arrays (the layer, moe.hpp, runs them on host memory):
///   sigmoid (V3): s = sigmoid(logits); choose with s + b (e_score_correction_bias, moved by
///                 the balancing rule, not by gradients), group-limited (a group's score is
///                 the sum of its two best; keep topk_group groups; the others' experts are
///                 out, -inf as DeepSeek's reference); top-k over the kept experts
///   softmax (V2): s = softmax(logits); top-k of s (greedy; with n_group > 1 limited to
///                 the topk_group groups of the best single scores, group_limited_greedy)
///   weights w_k = s_k of the chosen experts, / (sum_k s_k + 1e-20) if norm_topk_prob,
///   times routed_scaling_factor (transformers' DeepseekV3TopkRouter, in fp32).
/// The sequence-wise balance loss (DeepSeek-V3 report, eq. 17-20): per sequence of T tokens
///   L = alpha sum_i f_i P_i,  f_i = E / (K T) #{t: i chosen by t},  P_i = 1/T sum_t s'_t,i
/// with s' = s / sum_j s (the normalised scores; softmax scores already sum to 1). f is a
/// count (no gradient); P carries the gradient into the router.

#include <cstdint>
#include <vector>

#include "config/run_config.hpp"

namespace dst::model {

/// The router's shape and rule (from the model section).
struct RouterShape {
  std::int64_t experts = 0;     ///< E routed experts
  std::int64_t top_k = 0;       ///< K chosen per token
  std::int64_t groups = 1;      ///< n_group
  std::int64_t top_groups = 1;  ///< topk_group
  bool norm_topk = true;
  float scaling = 1.0f;  ///< routed_scaling_factor
  config::MoeScore score = config::MoeScore::sigmoid;

  static RouterShape of(const config::ModelSection& m);
};

/// For N tokens: scores (N, E) written from logits (N, E); the chosen experts idx (N, K) and
/// their weights (N, K). `bias` (E) the choice correction (sigmoid only; nullptr: none).
/// Ties go to the lower expert index.
void route_forward(const RouterShape& r, std::int64_t n, const float* logits, const float* bias,
                   float* scores, std::int32_t* idx, float* weights);

/// d(loss)/d(logits) (N, E), written, from d(loss)/d(weights) (N, K) and, if not nullptr,
/// d(loss)/d(scores) (N, E) of other uses of the scores (the balance loss). The choice
/// itself has no gradient.
void route_backward(const RouterShape& r, std::int64_t n, const float* scores,
                    const std::int32_t* idx, const float* d_weights, const float* d_scores,
                    float* d_logits);

/// The sequence-wise balance loss of B sequences of T tokens, summed over the sequences
/// (each sequence's alpha sum_i f_i P_i); if `d_scores` (B*T, E) is not nullptr, adds
/// `grad_scale` times the loss's gradient with respect to the scores to it.
double seq_aux_loss(const RouterShape& r, std::int64_t B, std::int64_t T, double alpha,
                    const float* scores, const std::int32_t* idx, float grad_scale,
                    float* d_scores);

/// The N*K (token, slot) pairs sorted by expert, tokens ascending within an expert: the
/// rows of the grouped expert products.
struct ExpertRows {
  std::vector<std::int64_t> offset;  ///< (E + 1) expert e's rows are [offset[e], offset[e+1])
  std::vector<std::int32_t> token;   ///< (N*K) the token of each row
  std::vector<std::int32_t> row;     ///< (N*K) row of token n's slot k, at n*K + k
};
/// Sorts `idx` (N, K) into `out` (a counting sort; out's vectors are reused).
void sort_by_expert(std::int64_t n, std::int64_t k, std::int64_t experts, const std::int32_t* idx,
                    ExpertRows& out);

}  // namespace dst::model
