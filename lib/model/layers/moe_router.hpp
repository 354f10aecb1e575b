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
/// Node-limited routing (DeepSeek-V3 report, 2.1.2; max_nodes M > 0 and the experts on
/// more than M nodes, expert_node): before the top-k, a node's score is the sum of the
/// max(1, K / M) best choice scores (s + b) of its experts (sigmoid), or its best score
/// (softmax, as V2's device-limited routing); the M best nodes are kept (ties to the lower
/// node), the other nodes' experts are out (-inf). Not combined with group-limited
/// routing (the deck refuses both).
/// Capacity (apply_capacity): after the choice, each expert keeps at most `capacity` of a
/// rank's rows, those of the highest router scores s (the affinity, without the bias;
/// ties to the lower token), as DeepSeek-V2 drops the lowest-affinity tokens; the
/// dropped rows' weights act as 0. The loads and the balance loss count the router's
/// choice, dropped rows included, so balancing still sees an overloaded expert.
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
  std::int64_t max_nodes = 0;  ///< node-limited routing's M; 0 = off
  /// (E) the node of each expert (ids 0 .. nodes - 1); empty: every expert on one node.
  std::vector<std::int32_t> expert_node;

  static RouterShape of(const config::ModelSection& m);
  /// Nodes the experts lie on (1 with no expert_node).
  std::int64_t nodes() const;
  /// Whether node-limited routing masks experts (max_nodes > 0 and fewer than nodes()).
  bool node_limited() const { return max_nodes > 0 && max_nodes < nodes(); }
};

/// The node map of `experts` experts split over `nodes` equal nodes in order (node j holds
/// [j E/nodes, (j+1) E/nodes)); throws dst::Error unless nodes divides experts.
std::vector<std::int32_t> equal_expert_nodes(std::int64_t experts, std::int64_t nodes);

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

/// Node-limited routing (DeepSeek-V3 report, 2.1.2; max_nodes M > 0 and the experts on
/// more than M nodes, expert_node): before the top-k, a node's score is the sum of the
/// max(1, K / M) best choice scores (s + b) of its experts (sigmoid), or its best score
/// (softmax, as V2's device-limited routing); the M best nodes are kept (ties to the lower
/// node), the other nodes' experts are out (-inf). Not combined with group-limited
/// routing (the deck refuses both).
/// Capacity (apply_capacity): after the choice, each expert keeps at most `capacity` of a
/// rank's rows, those of the highest router scores s (the affinity, without the bias;
/// ties to the lower token), as DeepSeek-V2 drops the lowest-affinity tokens; the
/// dropped rows' weights act as 0. The loads and the balance loss count the router's
/// choice, dropped rows included, so balancing still sees an overloaded expert.
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
  /// Rows dropped by apply_capacity: rows [offset[E], N*K), after every kept row (expert
  /// order, tokens ascending within an expert); 0 dropless.
  std::int64_t dropped = 0;
};
/// Sorts `idx` (N, K) into `out` (a counting sort; out's vectors are reused).
void sort_by_expert(std::int64_t n, std::int64_t k, std::int64_t experts, const std::int32_t* idx,
                    ExpertRows& out);

/// Expert capacity of `n` tokens: ceil(factor n k / experts); -1 (none) if factor <= 0.
std::int64_t expert_capacity(double factor, std::int64_t n, std::int64_t k, std::int64_t experts);
/// Drops the rows of `rows` (sort_by_expert's, n tokens) beyond `capacity` per expert:
/// an expert with more rows keeps the `capacity` of the highest scores s[token, e]
/// (`scores` (N, E)), ties to the lower token. Kept rows stay sorted by expert (tokens
/// ascending) in [0, offset[E]), offset counting kept rows only (what the products and
/// expert parallelism's dispatch see); the dropped rows follow (rows.dropped of them),
/// and rows.row still maps every (token, slot) to its row. Nothing moves when no expert
/// exceeds the capacity (a capacity < 0 drops nothing). Returns rows.dropped.
std::int64_t apply_capacity(std::int64_t n, std::int64_t k, std::int64_t experts,
                            const float* scores, std::int64_t capacity, ExpertRows& rows);

}  // namespace dst::model
