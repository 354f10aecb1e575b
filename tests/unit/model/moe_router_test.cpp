// DeepSeekMoE's router (layers/moe_router.hpp): the choice against its rule on hand-made
// scores, the backward and the sequence-wise balance loss's gradient against central
// finite differences in double, the token sort, and the balancing rule's closed form.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "config/run_config.hpp"
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

}  // namespace
