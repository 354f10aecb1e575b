// SwiGLU and cross-entropy against plain double references; gradients against finite
// differences of those references.
#include <cmath>
#include <limits>

#include "kernels_test_util.hpp"

namespace dst::kernels::test {
namespace {

// --- SwiGLU ------------------------------------------------------------------------------

double silu_ref(double x) {
  return x / (1.0 + std::exp(-x));
}

std::vector<double> swiglu_ref(const std::vector<double>& h1, const std::vector<double>& h3) {
  std::vector<double> y(h1.size());
  for (std::size_t i = 0; i < y.size(); ++i)
    y[i] = silu_ref(h1[i]) * h3[i];
  return y;
}

TEST(SwiGlu, ForwardMatchesReferenceIncludingLargeInputs) {
  const std::int64_t n = 3, f = 13;  // odd F
  auto h1 = random_vec(static_cast<std::size_t>(n * f), 60, -6.0f, 6.0f);
  auto h3 = random_vec(h1.size(), 61, -2.0f, 2.0f);
  // Saturated gates: silu(-1000) = -0 and silu(1000) = 1000 without inf or NaN.
  h1[0] = -1000.0f, h1[1] = 1000.0f, h1[2] = -90.0f, h1[3] = 90.0f;
  std::vector<float> out(h1.size());
  swiglu_forward(kokkos_ctx(), view(h1, {n, f}), view(h3, {n, f}), view(out, {n, f}));
  // exp, a division and three products in float: ~5 ulp relative; tiny outputs absolute.
  expect_close(out, swiglu_ref(to_double(h1), to_double(h3)), 1e-30, 1e-6, "out");
}

void check_swiglu_backward(std::int64_t n, std::int64_t f, std::uint32_t seed) {
  const Shape shape{n, f};
  const auto h1 = random_vec(static_cast<std::size_t>(n * f), seed, -6.0f, 6.0f);
  const auto h3 = random_vec(h1.size(), seed + 1, -2.0f, 2.0f);
  auto r = random_vec(h1.size(), seed + 2);
  auto a1 = h1, a3 = h3;
  std::vector<float> dh1(h1.size()), dh3(h1.size());
  swiglu_backward(kokkos_ctx(), view(r, shape), view(a1, shape), view(a3, shape), view(dh1, shape),
                  view(dh3, shape));
  const auto h1d = to_double(h1), h3d = to_double(h3);
  const auto g1 = fd_gradient(
      h1d, [&](const std::vector<double>& v) { return weighted_sum(swiglu_ref(v, h3d), r); });
  const auto g3 = fd_gradient(
      h3d, [&](const std::vector<double>& v) { return weighted_sum(swiglu_ref(h1d, v), r); });
  // silu'(x) = s (1 + x (1 - s)) in float: 1 - s cancels for large x (relative error of
  // 1 - s up to eps / (1 - s)), but x (1 - s) -> 0 there, so the absolute error stays
  // ~ |dout h3| * 1e-6.
  expect_close(dh1, g1, 2e-6, 1e-5, "dh1");
  expect_close(dh3, g3, 1e-7, 1e-6, "dh3");

  // dh1/dh3 aliasing h1/h3 (allowed): the same bits.
  auto b1 = h1, b3 = h3;
  swiglu_backward(kokkos_ctx(), view(r, shape), view(b1, shape), view(b3, shape), view(b1, shape),
                  view(b3, shape));
  expect_bitwise(b1, dh1, "in-place dh1");
  expect_bitwise(b3, dh3, "in-place dh3");
}

TEST(SwiGlu, BackwardMatchesFiniteDifferences) {
  check_swiglu_backward(1, 1, 62);
  check_swiglu_backward(4, 13, 63);
}

TEST(SwiGlu, BackwardSaturatedGatesAreExact) {
  // Far from 0: silu'(x) -> 1 for x >> 0 and -> 0 for x << 0, with no inf * 0.
  std::vector<float> h1{-1000.0f, 1000.0f, -100.0f, 100.0f}, h3{2, 2, 2, 2}, g{1, 1, 1, 1};
  std::vector<float> dh1(4), dh3(4);
  swiglu_backward(kokkos_ctx(), view(g, {4}), view(h1, {4}), view(h3, {4}), view(dh1, {4}),
                  view(dh3, {4}));
  expect_close(dh1, {0, 2, 0, 2}, 1e-30, 1e-7, "dh1");
  expect_close(dh3, {0, 1000, 0, 100}, 1e-30, 1e-7, "dh3");
}

// --- cross-entropy ---------------------------------------------------------------------

constexpr std::int32_t kIgnore = -100;

std::vector<double> ce_ref(const std::vector<double>& logits, const std::vector<std::int32_t>& tg,
                           std::int64_t v) {
  std::vector<double> loss(tg.size(), 0.0);
  for (std::size_t n = 0; n < tg.size(); ++n) {
    if (tg[n] == kIgnore) continue;
    double m = -std::numeric_limits<double>::infinity();
    for (std::int64_t j = 0; j < v; ++j)
      m = std::max(m, logits[n * v + j]);
    double s = 0;
    for (std::int64_t j = 0; j < v; ++j)
      s += std::exp(logits[n * v + j] - m);
    loss[n] = std::log(s) + m - logits[n * v + tg[n]];
  }
  return loss;
}

TEST(CrossEntropy, ForwardFusedAndGradientMatchReference) {
  const std::int64_t b = 2, t = 3, v = 259;  // V not a multiple of 8
  const float grad_scale = 1.0f / 5.0f;      // mean over the 5 counted tokens
  std::vector<std::int32_t> tg{0, 258, kIgnore, 17, 100, 1};
  const auto logits = random_vec(static_cast<std::size_t>(b * t * v), 70, -5.0f, 5.0f);
  auto lg = logits;
  std::vector<float> loss(tg.size(), -1.0f);
  cross_entropy_forward(kokkos_ctx(), view(lg, {b, t, v}), view(tg, {b, t}), kIgnore,
                        view(loss, {b, t}));
  const auto ref = ce_ref(to_double(logits), tg, v);
  // log-sum-exp of 259 float exps summed in double: each exp 1-2 ulp of a term <= 1, so
  // the log's argument is good to ~1e-7 relative; losses ~ 6 -> ~1e-6 absolute.
  expect_close(loss, ref, 1e-6, 1e-6, "losses");
  EXPECT_EQ(loss[2], 0.0f) << "ignored row";

  std::vector<float> fl(tg.size(), -1.0f), dl(logits.size(), -1.0f);
  cross_entropy_fused(kokkos_ctx(), view(lg, {b, t, v}), view(tg, {b, t}), kIgnore, grad_scale,
                      view(fl, {b, t}), view(dl, {b, t, v}));
  expect_close(fl, to_double(loss), 0, 1e-7, "fused losses vs forward losses");

  const auto g = fd_gradient(to_double(logits), [&](const std::vector<double>& lv) {
    double s = 0;
    for (double x : ce_ref(lv, tg, v))
      s += x;
    return grad_scale * s;
  });
  // Softmax entries ~ 1/V scaled by grad_scale: float rounding ~ 1e-8 absolute.
  expect_close(dl, g, 1e-8, 1e-5, "dlogits");
  for (std::int64_t j = 0; j < v; ++j)
    ASSERT_EQ(dl[2 * v + j], 0.0f) << "ignored row's grad";

  // dlogits aliasing logits (the logits buffer becomes its gradient): the same bits.
  auto inplace = logits;
  std::vector<float> il(tg.size());
  cross_entropy_fused(kokkos_ctx(), view(inplace, {b, t, v}), view(tg, {b, t}), kIgnore, grad_scale,
                      view(il, {b, t}), view(inplace, {b, t, v}));
  expect_bitwise(inplace, dl, "in-place dlogits");
  expect_bitwise(il, fl, "in-place losses");

  // Twice: the same bits (determinism).
  std::vector<float> fl2(tg.size()), dl2(logits.size());
  cross_entropy_fused(kokkos_ctx(), view(lg, {b, t, v}), view(tg, {b, t}), kIgnore, grad_scale,
                      view(fl2, {b, t}), view(dl2, {b, t, v}));
  expect_bitwise(dl2, dl, "repeated dlogits");
}

TEST(CrossEntropy, AllIgnoredBatchGivesZeros) {
  const std::int64_t n = 3, v = 7;
  std::vector<std::int32_t> tg(n, kIgnore);
  auto lg = random_vec(static_cast<std::size_t>(n * v), 71);
  std::vector<float> loss(n, -1.0f), dl(lg.size(), -1.0f);
  cross_entropy_fused(kokkos_ctx(), view(lg, {n, v}), view(tg, {n}), kIgnore, 0.5f, view(loss, {n}),
                      view(dl, {n, v}));
  expect_bitwise(loss, std::vector<float>(n, 0.0f), "losses");
  expect_bitwise(dl, std::vector<float>(lg.size(), 0.0f), "dlogits");
}

TEST(CrossEntropy, ExtremeLogitsStayFinite) {
  const std::int64_t v = 4;
  std::vector<std::int32_t> tg{1, 0};
  std::vector<float> lg{1e4f, -1e4f, 0.0f, 5e3f, -3e4f, 3e4f, 3e4f, 0.0f};
  std::vector<float> loss(2), dl(lg.size());
  const auto ref = ce_ref(to_double(lg), tg, v);
  cross_entropy_fused(kokkos_ctx(), view(lg, {2, v}), view(tg, {2}), kIgnore, 1.0f, view(loss, {2}),
                      view(dl, {2, v}));
  expect_close(loss, ref, 1e-3, 1e-6, "losses");  // 2e4 in float: ulp 2e-3
  expect_close(dl, {1, -1, 0, 0, -1, 0.5, 0.5, 0}, 1e-6, 0, "dlogits");
}

TEST(CrossEntropy, BadTargetThrowsWithValueAndPosition) {
  const std::int64_t n = 4, v = 259;
  auto lg = random_vec(static_cast<std::size_t>(n * v), 72);
  std::vector<float> loss(n), dl(lg.size());
  std::vector<std::int32_t> tg{0, kIgnore, 259, 5};
  expect_error(
      [&] {
        cross_entropy_forward(kokkos_ctx(), view(lg, {n, v}), view(tg, {n}), kIgnore,
                              view(loss, {n}));
      },
      {"cross_entropy_forward", "target 259", "position 2", "ignore index -100"});
  tg = {0, -1, 3, 5};
  expect_error(
      [&] {
        cross_entropy_fused(kokkos_ctx(), view(lg, {n, v}), view(tg, {n}), kIgnore, 1.0f,
                            view(loss, {n}), view(dl, {n, v}));
      },
      {"cross_entropy_fused", "target -1", "position 1"});
}

}  // namespace
}  // namespace dst::kernels::test
