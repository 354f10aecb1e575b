// AdamW against a double-precision reference of PyTorch's torch.optim.AdamW update.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels_test_util.hpp"

namespace dst::kernels::test {
namespace {

/// torch.optim.AdamW (decoupled weight decay, eps after the square root of the
/// bias-corrected second moment), in double. Takes the kernel's f32 gradients and scales
/// them the same way (one float product) so both see the same g.
struct ReferenceAdamW {
  std::vector<double> p, m, v;

  explicit ReferenceAdamW(const std::vector<float>& p0)
      : p(p0.begin(), p0.end()), m(p0.size(), 0.0), v(p0.size(), 0.0) {}

  void step(const std::vector<float>& grads, const AdamWHyper& h) {
    const double bias1 = 1.0 - std::pow(h.beta1, static_cast<double>(h.step));
    const double bias2 = 1.0 - std::pow(h.beta2, static_cast<double>(h.step));
    for (std::size_t i = 0; i < p.size(); ++i) {
      const double g = grads[i] * static_cast<float>(h.grad_scale);
      p[i] *= 1.0 - h.lr * h.weight_decay;
      m[i] = h.beta1 * m[i] + (1.0 - h.beta1) * g;
      v[i] = h.beta2 * v[i] + (1.0 - h.beta2) * g * g;
      const double mhat = m[i] / bias1;
      const double vhat = v[i] / bias2;
      p[i] -= h.lr * mhat / (std::sqrt(vhat) + h.eps);
    }
  }
};

struct Buffers {
  std::vector<float> p, g, m, v;
  explicit Buffers(const std::vector<float>& p0)
      : p(p0), g(p0.size()), m(p0.size(), 0.0f), v(p0.size(), 0.0f) {}
  void step(const AdamWHyper& h) {
    const Shape s{static_cast<std::int64_t>(p.size())};
    adamw_step(kokkos_ctx(), view(p, s), view(g, s), view(m, s), view(v, s), h);
  }
};

/// Gradients with three regimes: ordinary values; tiny ones (1e-9, below eps = 1e-8,
/// where putting eps inside the square root or before the bias correction would show);
/// and exact zeros (the update must be exactly 0 from zero moments).
std::vector<float> mixed_grads(std::size_t n, std::uint32_t seed) {
  auto g = random_vec(n, seed, -2.0f, 2.0f);
  for (std::size_t i = 0; i < n; ++i) {
    if (i % 7 == 3) g[i] *= 1e-9f;
    if (i % 11 == 5) g[i] = 0.0f;
  }
  return g;
}

// Per step and element the kernel rounds p twice (the decay, the final add: 2^-24 |p|
// each, |p| <= p_max) and the update lr * mhat / (sqrt(vhat) + eps) carries the error of
// ~8 float operations plus that of the f32 moments it reads (a few ulps, which the
// moments' exponential averaging does not amplify). |mhat / sqrt(vhat)| <= ~4 for these
// data, so 16 ulps of 4 lr bound the update's error; errors of successive steps add. The
// bound is absolute: a parameter that crosses zero keeps the error of its larger past.
double p_tolerance(int steps, double lr, double p_max = 2.0) {
  return steps * 0x1p-24 * (2 * p_max + 16 * 4 * lr);
}

// The moments: m = m + w (g - m) cancels when g and m have opposite signs, so its error is
// a few ulps of the largest |g| (<= 2 * 0.37 below), not of m; v is a sum of positive
// terms, so a few ulps of itself.
constexpr double kGradMax = 0.74;

TEST(AdamW, MatchesPyTorchFormulaOverSteps) {
  const std::size_t n = 1031;  // not a multiple of any vector width
  const auto p0 = random_vec(n, 1, -1.0f, 1.0f);
  Buffers k(p0);
  ReferenceAdamW ref(p0);
  AdamWHyper h;
  h.beta1 = 0.9;
  h.beta2 = 0.95;
  h.eps = 1e-8;
  h.weight_decay = 0.1;
  h.grad_scale = 0.37;
  const int steps = 12;
  for (int t = 1; t <= steps; ++t) {
    h.step = t;
    h.lr = 1e-2 * (1.0 + 0.1 * t);  // the schedule changes lr every step
    k.g = mixed_grads(n, 100 + static_cast<std::uint32_t>(t));
    k.step(h);
    ref.step(k.g, h);
    expect_close(k.p, ref.p, p_tolerance(t, h.lr), 0, "p at step " + std::to_string(t));
    // The moments: a few float operations per step on values of one scale each.
    expect_close(k.m, ref.m, t * 4 * 0x1p-24 * kGradMax, 0, "m at step " + std::to_string(t));
    expect_close(k.v, ref.v, 0, t * 4 * 0x1p-24, "v at step " + std::to_string(t));
  }
  // Zero gradients throughout: the parameter only decays.
  for (std::size_t i = 5; i < n; i += 11) {
    double expected = p0[i];
    for (int t = 1; t <= steps; ++t)
      expected *= 1.0 - 1e-2 * (1.0 + 0.1 * t) * 0.1;
    EXPECT_NEAR(k.p[i], expected, steps * 2 * 0x1p-24 * std::fabs(expected)) << i;
  }
}

TEST(AdamW, FirstStepIsBiasCorrectedSignDescent) {
  // At t = 1 the bias corrections make mhat = g and vhat = g^2 exactly, so the update is
  // lr * g / (|g| + eps): lr * sign(g) for |g| >> eps, whatever the betas. Without the
  // correction it would be (1 - b1) / sqrt(1 - b2) = 0.316 lr for these betas.
  const std::vector<float> p0{0.5f, -0.25f, 1.0f, 0.0f, 2.0f};
  Buffers k(p0);
  k.g = {3.0f, -1e-3f, 0.5f, -7.0f, 1e-8f};
  AdamWHyper h;
  h.lr = 1e-3;
  h.beta1 = 0.9;
  h.beta2 = 0.99;
  h.eps = 1e-8;
  h.weight_decay = 0.1;
  h.step = 1;
  k.step(h);
  std::vector<double> expected(p0.size());
  for (std::size_t i = 0; i < p0.size(); ++i) {
    const double g = k.g[i];
    expected[i] = p0[i] * (1.0 - h.lr * h.weight_decay) - h.lr * g / (std::fabs(g) + h.eps);
  }
  // Element 4: g = eps, so the step is lr / 2, not lr: eps is added after the sqrt (up to
  // 1e-8f != 1e-8, 3e-9 relative of the lr / 2 step).
  EXPECT_NEAR(expected[4], 2.0 * (1.0 - 1e-4) - 0.5e-3, 1e-11);
  expect_close(k.p, expected, p_tolerance(1, h.lr), 0, "p after step 1");
}

TEST(AdamW, LateStepWithGivenMoments) {
  // Step 10000 from non-zero moments (a resumed run): bias1 = 1 - 0.9^10000 = 1 exactly
  // in double, bias2 = 1 - 0.999^10000 = 0.99995: the correction must still be applied.
  const std::size_t n = 64;
  const auto p0 = random_vec(n, 3);
  Buffers k(p0);
  ReferenceAdamW ref(p0);
  k.m = random_vec(n, 4, -1e-2f, 1e-2f);
  k.v = random_vec(n, 5, 1e-6f, 1e-4f);
  ref.m.assign(k.m.begin(), k.m.end());
  ref.v.assign(k.v.begin(), k.v.end());
  k.g = random_vec(n, 6, -1e-2f, 1e-2f);
  AdamWHyper h;
  h.lr = 3e-4;
  h.beta2 = 0.999;
  h.weight_decay = 0.0;
  h.step = 10000;
  k.step(h);
  ref.step(k.g, h);
  // |mhat/sqrt(vhat)| <= ~10 here (m ~ 1e-2, sqrt(v) >= 1e-3): scale the bound.
  expect_close(k.p, ref.p, 2.5 * p_tolerance(1, h.lr), 0, "p");
  expect_close(k.m, ref.m, 4 * 0x1p-24 * 1e-2, 0, "m");
  expect_close(k.v, ref.v, 0, 4 * 0x1p-24, "v");
}

TEST(AdamW, WeightDecayZeroLeavesDecayOut) {
  const std::size_t n = 100;
  const auto p0 = random_vec(n, 7, 1.0f, 2.0f);
  Buffers decayed(p0), plain(p0);
  decayed.g = plain.g = random_vec(n, 8);
  ReferenceAdamW ref(p0);
  AdamWHyper h;
  h.lr = 1e-2;
  h.weight_decay = 0.0;
  plain.step(h);
  ref.step(plain.g, h);
  expect_close(plain.p, ref.p, p_tolerance(1, h.lr), 0, "p without decay");
  h.weight_decay = 0.5;
  decayed.step(h);
  // Decay of lr * wd * p = 5e-3 * p (>= 5e-3 here) separates the two far beyond rounding.
  for (std::size_t i = 0; i < n; ++i)
    EXPECT_NEAR(plain.p[i] - decayed.p[i], 5e-3 * p0[i], 1e-6) << i;
}

TEST(AdamW, GradScaleIsAppliedToTheGradientFirst) {
  // grad_scale multiplies each gradient once in float: the same bits as pre-scaled
  // gradients with grad_scale 1 (a bitwise claim: identical float operations).
  const std::size_t n = 257;
  const auto p0 = random_vec(n, 9);
  Buffers scaled(p0), prescaled(p0);
  AdamWHyper h;
  h.lr = 1e-3;
  h.weight_decay = 0.1;
  for (int t = 1; t <= 3; ++t) {
    h.step = t;
    scaled.g = random_vec(n, 20 + static_cast<std::uint32_t>(t), -100.0f, 100.0f);
    prescaled.g = scaled.g;
    for (auto& x : prescaled.g)
      x *= 1.0f / 64.0f * 0.8f;
    h.grad_scale = static_cast<double>(1.0f / 64.0f * 0.8f);
    scaled.step(h);
    h.grad_scale = 1.0;
    prescaled.step(h);
  }
  expect_bitwise(scaled.p, prescaled.p, "p");
  expect_bitwise(scaled.m, prescaled.m, "m");
  expect_bitwise(scaled.v, prescaled.v, "v");
}

TEST(AdamW, Deterministic) {
  const std::size_t n = 4099;
  const auto p0 = random_vec(n, 10);
  Buffers a(p0), b(p0);
  a.g = b.g = random_vec(n, 11);
  AdamWHyper h;
  h.lr = 1e-3;
  h.weight_decay = 0.1;
  for (int t = 1; t <= 3; ++t) {
    h.step = t;
    a.step(h);
    b.step(h);
  }
  expect_bitwise(a.p, b.p, "p");
  expect_bitwise(a.m, b.m, "m");
  expect_bitwise(a.v, b.v, "v");
}

TEST(AdamW, RejectsBadArguments) {
  std::vector<float> p(8), g(8), m(8), v(8), short_v(7);
  const auto ctx = kokkos_ctx();
  auto run = [&](const AdamWHyper& h) {
    adamw_step(ctx, view(p, {8}), view(g, {8}), view(m, {8}), view(v, {8}), h);
  };
  AdamWHyper h;
  h.lr = 1e-3;
  EXPECT_NO_THROW(run(h));
  AdamWHyper bad = h;
  bad.step = 0;
  expect_error([&] { run(bad); }, {"kernels::adamw_step", "step", "1-based", "0"});
  bad = h;
  bad.beta1 = 1.0;
  expect_error([&] { run(bad); }, {"kernels::adamw_step", "beta1", "[0, 1)"});
  bad = h;
  bad.lr = -1.0;
  expect_error([&] { run(bad); }, {"kernels::adamw_step", "lr", ">= 0"});
  bad = h;
  bad.eps = 1e-60;  // 0 in float
  expect_error([&] { run(bad); }, {"kernels::adamw_step", "eps"});
  bad = h;
  bad.weight_decay = -0.1;
  expect_error([&] { run(bad); }, {"kernels::adamw_step", "weight_decay"});
  bad = h;
  bad.grad_scale = std::numeric_limits<double>::infinity();
  expect_error([&] { run(bad); }, {"kernels::adamw_step", "grad_scale"});
  expect_error(
      [&] { adamw_step(ctx, view(p, {8}), view(g, {8}), view(m, {8}), view(short_v, {7}), h); },
      {"kernels::adamw_step", "v", "(8)", "(7)"});
  EXPECT_NO_THROW(adamw_step(ctx, Tensor{nullptr, Shape{0}}, Tensor{nullptr, Shape{0}},
                             Tensor{nullptr, Shape{0}}, Tensor{nullptr, Shape{0}}, h));
}

}  // namespace
}  // namespace dst::kernels::test
