// DeepSeekMoE's router (layers/moe_router.hpp): the choice against its rule on hand-made
// scores, the backward and the sequence-wise balance loss's gradient against central
// finite differences in double, the token sort, and the balancing rule's closed form;
// node-limited routing (a token's experts on at most M nodes, M = nodes unrestricted bit
// for bit, hand-made cases) and the experts' capacity (which rows drop, the layout).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "config/run_config.hpp"
#include "core/error.hpp"
#include "model/layers/moe_router.hpp"

namespace {

using dst::config::MoeScore;
using dst::model::RouterShape;

RouterShape shape(std::int64_t E, std::int64_t K, std::int64_t G, std::int64_t TG, bool norm,
                  float scaling, MoeScore score) {
  RouterShape r;
  r.experts = E;
  r.top_k = K;
  r.groups = G;
  r.top_groups = TG;
  r.norm_topk = norm;
  r.scaling = scaling;
  r.score = score;
  return r;
}

std::vector<float> random_logits(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v)
    x = d(gen);
  return v;
}

float inverse_sigmoid(float s) {
  return std::log(s / (1.0f - s));
}

// Group-limited choice: groups {0,1} {2,3} {4,5} {6,7}; group scores (sum of both) 1.0,
// 1.5, 0.4, 1.1 -> keep groups 1 and 3; top-2 among experts 2, 3, 6, 7 = 3 (0.8) and 6
// (0.75), though expert 0 (0.9) has the highest score overall.
TEST(MoeRouter, GroupLimitedChoiceKeepsTheBestGroups) {
  const std::vector<float> s{0.9f, 0.1f, 0.7f, 0.8f, 0.2f, 0.2f, 0.75f, 0.35f};
  std::vector<float> logits;
  for (float v : s)
    logits.push_back(inverse_sigmoid(v));
  std::vector<float> scores(8), w(2);
  std::vector<std::int32_t> idx(2);
  dst::model::route_forward(shape(8, 2, 4, 2, true, 2.5f, MoeScore::sigmoid), 1, logits.data(),
                            nullptr, scores.data(), idx.data(), w.data());
  EXPECT_EQ(idx[0], 3);
  EXPECT_EQ(idx[1], 6);
  // Renormalised over the chosen scores, times the scaling factor.
  EXPECT_NEAR(w[0], 2.5f * 0.8f / 1.55f, 1e-6f);
  EXPECT_NEAR(w[1], 2.5f * 0.75f / 1.55f, 1e-6f);
}

// The correction bias changes the choice, never the weights (from the unbiased scores).
TEST(MoeRouter, BiasMovesTheChoiceNotTheWeights) {
  const std::vector<float> s{0.9f, 0.6f, 0.5f, 0.4f};
  std::vector<float> logits;
  for (float v : s)
    logits.push_back(inverse_sigmoid(v));
  const std::vector<float> bias{-0.5f, 0.0f, 0.0f, 0.3f};  // choice 0.4, 0.6, 0.5, 0.7
  std::vector<float> scores(4), w(2);
  std::vector<std::int32_t> idx(2);
  dst::model::route_forward(shape(4, 2, 1, 1, false, 1.0f, MoeScore::sigmoid), 1, logits.data(),
                            bias.data(), scores.data(), idx.data(), w.data());
  EXPECT_EQ(idx[0], 3);
  EXPECT_EQ(idx[1], 1);
  EXPECT_NEAR(w[0], 0.4f, 1e-6f);
  EXPECT_NEAR(w[1], 0.6f, 1e-6f);
}

/// L = sum_t,k r_t,k w_t,k + balance loss: route_backward's gradient against central
/// differences of L in the logits (the choice is held fixed: a step of 1e-3 in a logit
/// moves the scores by < 3e-4, below the gaps of these random scores, checked).
void check_backward(const RouterShape& r, double alpha) {
  const std::int64_t B = 2, T = 5, N = B * T, E = r.experts, K = r.top_k;
  const auto logits = random_logits(static_cast<std::size_t>(N * E), 7);
  const auto dw = random_logits(static_cast<std::size_t>(N * K), 8);
  std::vector<float> scores(logits.size()), w(dw.size());
  std::vector<std::int32_t> idx(dw.size());
  dst::model::route_forward(r, N, logits.data(), nullptr, scores.data(), idx.data(), w.data());
  const float grad_scale = 0.5f;  // as the model's aux_grad_scale
  std::vector<float> d_scores(scores.size(), 0.0f), d_logits(scores.size());
  dst::model::seq_aux_loss(r, B, T, alpha, scores.data(), idx.data(), grad_scale, d_scores.data());
  dst::model::route_backward(r, N, scores.data(), idx.data(), dw.data(), d_scores.data(),
                             d_logits.data());

  auto objective = [&](const std::vector<float>& l) {
    std::vector<float> s(l.size()), ww(w.size());
    std::vector<std::int32_t> ix(idx.size());
    dst::model::route_forward(r, N, l.data(), nullptr, s.data(), ix.data(), ww.data());
    EXPECT_EQ(ix, idx) << "the finite-difference step changed the choice";
    double v = 0.0;
    for (std::size_t i = 0; i < ww.size(); ++i)
      v += static_cast<double>(dw[i]) * ww[i];
    return v + grad_scale *
                   dst::model::seq_aux_loss(r, B, T, alpha, s.data(), ix.data(), 0.0f, nullptr);
  };
  const float h = 1e-3f;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    auto up = logits, down = logits;
    up[i] += h;
    down[i] -= h;
    const double fd = (objective(up) - objective(down)) / (2.0 * h);
    // Float forward (errors ~1e-7 relative of values ~1) over a step of 2e-3: ~1e-4.
    EXPECT_NEAR(d_logits[i], fd, 2e-3 * std::max(1.0, std::abs(fd))) << "logit " << i;
  }
}

TEST(MoeRouter, SigmoidRenormalisedBackwardMatchesFiniteDifferences) {
  check_backward(shape(8, 2, 1, 1, true, 2.5f, MoeScore::sigmoid), 0.0);
}
TEST(MoeRouter, SigmoidGroupedBackwardMatchesFiniteDifferences) {
  check_backward(shape(8, 3, 4, 2, false, 1.0f, MoeScore::sigmoid), 0.0);
}
TEST(MoeRouter, SoftmaxBackwardMatchesFiniteDifferences) {
  check_backward(shape(6, 2, 1, 1, false, 1.0f, MoeScore::softmax), 0.0);
}
// With the balance loss at a weight (3) large enough that its gradient dominates.
TEST(MoeRouter, BalanceLossGradientMatchesFiniteDifferences) {
  check_backward(shape(8, 2, 1, 1, true, 1.0f, MoeScore::sigmoid), 3.0);
  check_backward(shape(6, 2, 1, 1, false, 1.0f, MoeScore::softmax), 3.0);
}

// Closed forms: balanced routing gives L = alpha (every f_i = 1, sum_i P_i = 1); routing
// that follows skewed scores costs more.
TEST(MoeRouter, BalanceLossClosedForms) {
  const RouterShape r = shape(4, 2, 1, 1, true, 1.0f, MoeScore::sigmoid);
  const std::int64_t T = 2;
  const std::vector<float> scores(static_cast<std::size_t>(T * 4), 0.5f);  // uniform: P_i = 1/4
  // Token 0 -> {0, 1}, token 1 -> {2, 3}: every f_i = 4 / (2 * 2) * 1 = 1 -> L = alpha.
  const std::vector<std::int32_t> balanced{0, 1, 2, 3};
  EXPECT_NEAR(dst::model::seq_aux_loss(r, 1, T, 0.1, scores.data(), balanced.data(), 0.0f, nullptr),
              0.1, 1e-12);
  const std::vector<float> skewed{0.9f, 0.9f, 0.1f, 0.1f, 0.9f, 0.9f, 0.1f, 0.1f};
  const std::vector<std::int32_t> same{0, 1, 0, 1};
  // P_0 = P_1 = 0.45, f_0 = f_1 = 2: L = alpha * 2 * 2 * 0.45 = 1.8 alpha.
  EXPECT_NEAR(dst::model::seq_aux_loss(r, 1, T, 0.1, skewed.data(), same.data(), 0.0f, nullptr),
              0.18, 1e-7);
}

TEST(MoeRouter, SortByExpertGroupsRowsInTokenOrder) {
  const std::vector<std::int32_t> idx{2, 0, 0, 1, 2, 1};  // 3 tokens, top-2, 3 experts
  dst::model::ExpertRows rows;
  dst::model::sort_by_expert(3, 2, 4, idx.data(), rows);
  EXPECT_EQ(rows.offset, (std::vector<std::int64_t>{0, 2, 4, 6, 6}));  // expert 3: none
  EXPECT_EQ(rows.token, (std::vector<std::int32_t>{0, 1, 1, 2, 0, 2}));
  for (std::size_t i = 0; i < idx.size(); ++i) {
    const std::int32_t row = rows.row[i];
    EXPECT_EQ(rows.token[static_cast<std::size_t>(row)], static_cast<std::int32_t>(i / 2));
    EXPECT_GE(row, rows.offset[static_cast<std::size_t>(idx[i])]);
    EXPECT_LT(row, rows.offset[static_cast<std::size_t>(idx[i]) + 1]);
  }
}

// --- node-limited routing ---------------------------------------------------------------

RouterShape with_nodes(RouterShape r, std::int64_t max_nodes, std::int64_t nodes) {
  r.max_nodes = max_nodes;
  r.expert_node = dst::model::equal_expert_nodes(r.experts, nodes);
  return r;
}

struct Routed {
  std::vector<float> scores, w;
  std::vector<std::int32_t> idx;
};
Routed route(const RouterShape& r, std::int64_t n, const std::vector<float>& logits,
             const float* bias = nullptr) {
  Routed out;
  out.scores.resize(logits.size());
  out.w.resize(static_cast<std::size_t>(n * r.top_k));
  out.idx.resize(out.w.size());
  dst::model::route_forward(r, n, logits.data(), bias, out.scores.data(), out.idx.data(),
                            out.w.data());
  return out;
}

// Nodes {0,1} {2,3} {4,5} {6,7}, K = 2, M = 1: a node scores the sum of its K/M = 2 best:
// 1.0, 1.3, 0.4, 1.1 -> node 1 alone, experts 2 and 3, though expert 0 scores highest.
TEST(MoeRouter, NodeLimitedChoiceKeepsTheBestNodes) {
  const std::vector<float> s{0.9f, 0.1f, 0.7f, 0.6f, 0.2f, 0.2f, 0.8f, 0.3f};
  std::vector<float> logits;
  for (float v : s)
    logits.push_back(inverse_sigmoid(v));
  const RouterShape plain = shape(8, 2, 1, 1, true, 1.0f, MoeScore::sigmoid);
  const Routed one = route(with_nodes(plain, 1, 4), 1, logits);
  EXPECT_EQ(one.idx, (std::vector<std::int32_t>{2, 3}));
  EXPECT_NEAR(one.w[0], 0.7f / 1.3f, 1e-6f);
  // M = 2, K/M = 1: a node scores its best: 0.9, 0.7, 0.2, 0.8 -> nodes 0 and 3: 0 and 6.
  EXPECT_EQ(route(with_nodes(plain, 2, 4), 1, logits).idx, (std::vector<std::int32_t>{0, 6}));
  // The bias enters the node scores (sigmoid): -0.5 on expert 2 makes node 1 0.8 < 1.1.
  std::vector<float> bias(8, 0.0f);
  bias[2] = -0.5f;
  EXPECT_EQ(route(with_nodes(plain, 1, 4), 1, logits, bias.data()).idx,
            (std::vector<std::int32_t>{6, 7}));
  // Unrestricted: 0 (0.9) and 6 (0.8).
  EXPECT_EQ(route(plain, 1, logits).idx, (std::vector<std::int32_t>{0, 6}));
}

// Softmax (V2's device-limited rule): a node scores its best expert.
TEST(MoeRouter, NodeLimitedSoftmaxScoresANodeByItsBest) {
  // Softmax of log(v) is v / sum v: the order of v.
  const std::vector<float> v{0.05f, 0.3f, 0.2f, 0.2f, 0.1f, 0.15f};
  std::vector<float> logits;
  for (float x : v)
    logits.push_back(std::log(x));
  const RouterShape plain = shape(6, 2, 1, 1, false, 1.0f, MoeScore::softmax);
  // Nodes {0,1} {2,3} {4,5}: best 0.3, 0.2, 0.15; M = 1 -> node 0: experts 1 and 0,
  // though 2 and 3 (0.2 each) beat expert 0.
  EXPECT_EQ(route(with_nodes(plain, 1, 3), 1, logits).idx, (std::vector<std::int32_t>{1, 0}));
  EXPECT_EQ(route(plain, 1, logits).idx, (std::vector<std::int32_t>{1, 2}));
}

// Random tokens: never more than M nodes; M >= nodes (or no map) routes as without the
// limit, bit for bit.
TEST(MoeRouter, NodeLimitedRoutingBoundsTheNodesOfEveryToken) {
  const std::int64_t N = 200, E = 16;
  for (const MoeScore score : {MoeScore::sigmoid, MoeScore::softmax}) {
    const RouterShape plain = shape(E, 4, 1, 1, true, 2.5f, score);
    const auto logits = random_logits(static_cast<std::size_t>(N * E), 11);
    const auto bias = random_logits(static_cast<std::size_t>(E), 12);
    const Routed free = route(plain, N, logits, bias.data());
    for (const std::int64_t nodes : {2, 4, 8}) {
      for (std::int64_t M = 1; M <= nodes; ++M) {
        if (M * (E / nodes) < 4) continue;  // M nodes must hold top-k experts
        const RouterShape r = with_nodes(plain, M, nodes);
        const Routed got = route(r, N, logits, bias.data());
        if (M == nodes) {
          EXPECT_EQ(got.idx, free.idx);
          EXPECT_EQ(got.w, free.w);
          continue;
        }
        std::int64_t limited = 0;
        for (std::int64_t t = 0; t < N; ++t) {
          std::set<std::int32_t> used;
          std::set<std::int32_t> free_used;
          for (std::int64_t k = 0; k < 4; ++k) {
            used.insert(r.expert_node[static_cast<std::size_t>(got.idx[t * 4 + k])]);
            free_used.insert(r.expert_node[static_cast<std::size_t>(free.idx[t * 4 + k])]);
          }
          EXPECT_LE(static_cast<std::int64_t>(used.size()), M) << "token " << t;
          if (static_cast<std::int64_t>(free_used.size()) > M) ++limited;
        }
        // Top-4 spans at most 4 nodes: a limit of M < 4 nodes must bite somewhere.
        if (M < 4) EXPECT_GT(limited, 0) << "nodes " << nodes << " M " << M << ": never bit";
      }
    }
    // No node map, or M = 0: unrestricted.
    RouterShape no_map = plain;
    no_map.max_nodes = 1;
    EXPECT_EQ(route(no_map, N, logits, bias.data()).idx, free.idx);
    EXPECT_EQ(route(with_nodes(plain, 0, 4), N, logits, bias.data()).idx, free.idx);
  }
}

TEST(MoeRouter, EqualExpertNodesSplitInOrder) {
  EXPECT_EQ(dst::model::equal_expert_nodes(8, 4),
            (std::vector<std::int32_t>{0, 0, 1, 1, 2, 2, 3, 3}));
  EXPECT_THROW(dst::model::equal_expert_nodes(8, 3), dst::Error);
}

// --- capacity ----------------------------------------------------------------------------

TEST(MoeRouter, ExpertCapacityIsTheCeilingOfFactorTimesAnEvenShare) {
  EXPECT_EQ(dst::model::expert_capacity(0.0, 10, 2, 8), -1);  // dropless
  EXPECT_EQ(dst::model::expert_capacity(1.0, 16, 2, 8), 4);
  EXPECT_EQ(dst::model::expert_capacity(1.25, 10, 2, 8), 4);  // ceil(3.125)
  EXPECT_EQ(dst::model::expert_capacity(0.01, 10, 2, 8), 1);
  EXPECT_EQ(dst::model::expert_capacity(100.0, 10, 2, 8), 250);
}

// 5 tokens, top-1, 2 experts, capacity 2: expert 0, chosen by tokens 0, 1, 2, 4 with
// scores 0.5, 0.9, 0.5, 0.7, keeps tokens 1 (0.9) and 4 (0.7); with token 4 at 0.5 too,
// the tie between tokens 0, 2 and 4 for the second place keeps token 0 (the lowest).
TEST(MoeRouter, CapacityKeepsTheHighestScoresTiesToTheLowerToken) {
  const std::vector<std::int32_t> idx{0, 0, 0, 1, 0};
  std::vector<float> scores{0.5f, 0.1f, 0.9f, 0.1f, 0.5f, 0.1f, 0.2f, 0.6f, 0.7f, 0.2f};
  dst::model::ExpertRows rows;
  dst::model::sort_by_expert(5, 1, 2, idx.data(), rows);
  EXPECT_EQ(dst::model::apply_capacity(5, 1, 2, scores.data(), 2, rows), 2);
  EXPECT_EQ(rows.dropped, 2);
  // Kept: expert 0's tokens 1 and 4 (token order), expert 1's token 3; then the dropped
  // tokens 0 and 2 of expert 0.
  EXPECT_EQ(rows.offset, (std::vector<std::int64_t>{0, 2, 3}));
  EXPECT_EQ(rows.token, (std::vector<std::int32_t>{1, 4, 3, 0, 2}));
  EXPECT_EQ(rows.row, (std::vector<std::int32_t>{3, 0, 4, 2, 1}));

  scores[8] = 0.5f;  // token 4: a tie with tokens 0 and 2 for the second place
  dst::model::sort_by_expert(5, 1, 2, idx.data(), rows);
  EXPECT_EQ(dst::model::apply_capacity(5, 1, 2, scores.data(), 2, rows), 2);
  EXPECT_EQ(rows.token, (std::vector<std::int32_t>{0, 1, 3, 2, 4}));
}

// Random routing: every expert keeps min(count, capacity) rows, the kept rows are the
// best of their expert, every (token, slot) still maps to a row of its token; a capacity
// no expert reaches leaves sort_by_expert's layout as it was.
TEST(MoeRouter, CapacityCountsAndLayout) {
  const std::int64_t N = 64, E = 8, K = 2;
  const RouterShape r = shape(E, K, 1, 1, true, 1.0f, MoeScore::sigmoid);
  const auto logits = random_logits(static_cast<std::size_t>(N * E), 21);
  // A bias that crowds experts 0 and 1.
  std::vector<float> bias(E, 0.0f);
  bias[0] = bias[1] = 0.4f;
  const Routed routed = route(r, N, logits, bias.data());
  dst::model::ExpertRows sorted;
  dst::model::sort_by_expert(N, K, E, routed.idx.data(), sorted);
  for (const std::int64_t capacity : {1, 5, 16, 40, 1000}) {
    dst::model::ExpertRows rows = sorted;
    const std::int64_t dropped =
        dst::model::apply_capacity(N, K, E, routed.scores.data(), capacity, rows);
    std::int64_t expect_dropped = 0;
    for (std::int64_t e = 0; e < E; ++e) {
      const std::int64_t count = sorted.offset[static_cast<std::size_t>(e + 1)] -
                                 sorted.offset[static_cast<std::size_t>(e)];
      expect_dropped += std::max<std::int64_t>(0, count - capacity);
      EXPECT_EQ(
          rows.offset[static_cast<std::size_t>(e + 1)] - rows.offset[static_cast<std::size_t>(e)],
          std::min(count, capacity));
    }
    EXPECT_EQ(dropped, expect_dropped) << "capacity " << capacity;
    EXPECT_EQ(rows.offset.back() + dropped, N * K);
    if (dropped == 0) {
      EXPECT_EQ(rows.token, sorted.token);
      EXPECT_EQ(rows.row, sorted.row);
      continue;
    }
    EXPECT_GT(capacity, 0);
    // Each (token, slot): its row holds its token; kept rows lie in their expert's range
    // and score at least as high as any dropped row of the same expert.
    std::vector<float> worst_kept(E, 2.0f), best_dropped(E, -1.0f);
    for (std::int64_t t = 0; t < N; ++t)
      for (std::int64_t k = 0; k < K; ++k) {
        const std::int32_t e = routed.idx[static_cast<std::size_t>(t * K + k)];
        const std::int32_t row = rows.row[static_cast<std::size_t>(t * K + k)];
        EXPECT_EQ(rows.token[static_cast<std::size_t>(row)], t);
        const float s = routed.scores[static_cast<std::size_t>(t * E + e)];
        if (row < rows.offset.back()) {
          EXPECT_GE(row, rows.offset[static_cast<std::size_t>(e)]);
          EXPECT_LT(row, rows.offset[static_cast<std::size_t>(e + 1)]);
          worst_kept[static_cast<std::size_t>(e)] =
              std::min(worst_kept[static_cast<std::size_t>(e)], s);
        } else {
          best_dropped[static_cast<std::size_t>(e)] =
              std::max(best_dropped[static_cast<std::size_t>(e)], s);
        }
      }
    for (std::int64_t e = 0; e < E; ++e)
      EXPECT_GE(worst_kept[static_cast<std::size_t>(e)], best_dropped[static_cast<std::size_t>(e)])
          << "expert " << e;
    // Kept rows of an expert in token order.
    for (std::int64_t e = 0; e < E; ++e)
      EXPECT_TRUE(
          std::is_sorted(rows.token.begin() + rows.offset[static_cast<std::size_t>(e)],
                         rows.token.begin() + rows.offset[static_cast<std::size_t>(e + 1)]));
  }
}

}  // namespace
