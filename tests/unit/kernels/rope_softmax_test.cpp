// RoPE and the causal attention softmax against plain double references; gradients
// against finite differences of those references.
#include <cmath>
#include <limits>

#include "kernels_test_util.hpp"

namespace dst::kernels::test {
namespace {

// --- RoPE ------------------------------------------------------------------------------

std::vector<double> rope_angles(std::int64_t t_len, std::int64_t d, double theta) {
  std::vector<double> a(static_cast<std::size_t>(t_len * d / 2));
  for (std::int64_t t = 0; t < t_len; ++t)
    for (std::int64_t i = 0; i < d / 2; ++i)
      a[t * (d / 2) + i] = static_cast<double>(t) * std::pow(theta, -2.0 * i / d);
  return a;
}

/// Rotate-half with exact double cos/sin of the double angles.
std::vector<double> rope_ref(const std::vector<double>& x, std::int64_t b, std::int64_t t_len,
                             std::int64_t h, std::int64_t d, double theta) {
  const auto ang = rope_angles(t_len, d, theta);
  std::vector<double> y(x.size());
  const std::int64_t half = d / 2;
  for (std::int64_t row = 0; row < b * t_len * h; ++row) {
    const std::int64_t t = (row / h) % t_len;
    for (std::int64_t i = 0; i < half; ++i) {
      const double c = std::cos(ang[t * half + i]), s = std::sin(ang[t * half + i]);
      const double lo = x[row * d + i], hi = x[row * d + i + half];
      y[row * d + i] = lo * c - hi * s;
      y[row * d + i + half] = hi * c + lo * s;
    }
  }
  return y;
}

TEST(Rope, TablesMatchDoubleAngles) {
  const std::int64_t t_len = 64, d = 10;
  const double theta = 10000.0;
  std::vector<float> cs(static_cast<std::size_t>(t_len * d / 2)), sn = cs;
  rope_tables(kokkos_ctx(), theta, view(cs, {t_len, d / 2}), view(sn, {t_len, d / 2}));
  const auto ang = rope_angles(t_len, d, theta);
  std::vector<double> ec(ang.size()), es(ang.size());
  for (std::size_t k = 0; k < ang.size(); ++k)
    ec[k] = std::cos(ang[k]), es[k] = std::sin(ang[k]);
  // Computed in double, rounded once: half an ulp of values <= 1 (6e-8).
  expect_close(cs, ec, 6e-8, 0, "cos");
  expect_close(sn, es, 6e-8, 0, "sin");
}

void check_rope(std::int64_t b, std::int64_t t_len, std::int64_t h, std::int64_t d,
                std::int64_t table_len, std::uint32_t seed) {
  const double theta = 500.0;
  std::vector<float> cs(static_cast<std::size_t>(table_len * d / 2)), sn = cs;
  rope_tables(kokkos_ctx(), theta, view(cs, {table_len, d / 2}), view(sn, {table_len, d / 2}));
  const auto x0 = random_vec(static_cast<std::size_t>(b * t_len * h * d), seed);
  auto x = x0;
  rope_forward(kokkos_ctx(), view(x, {b, t_len, h, d}), view(cs, {table_len, d / 2}),
               view(sn, {table_len, d / 2}));
  // Table rounding (6e-8) plus two float products and a sum of values <= 1.
  expect_close(x, rope_ref(to_double(x0), b, t_len, h, d, theta), 3e-7, 0, "rope_forward");

  // Backward = gradient of L = sum(rope(x) * r): FD of the (linear) double reference.
  const auto r = random_vec(x0.size(), seed + 1);
  auto dx = r;
  rope_backward(kokkos_ctx(), view(dx, {b, t_len, h, d}), view(cs, {table_len, d / 2}),
                view(sn, {table_len, d / 2}));
  const auto g = fd_gradient(to_double(x0), [&](const std::vector<double>& xv) {
    return weighted_sum(rope_ref(xv, b, t_len, h, d, theta), r);
  });
  expect_close(dx, g, 3e-7, 0, "rope_backward");

  // Forward then backward is the identity up to the roundings above.
  rope_backward(kokkos_ctx(), view(x, {b, t_len, h, d}), view(cs, {table_len, d / 2}),
                view(sn, {table_len, d / 2}));
  expect_close(x, to_double(x0), 6e-7, 0, "rope round trip");
}

TEST(Rope, ForwardAndBackwardMatchReference) {
  check_rope(2, 5, 3, 8, 5, 40);
  check_rope(1, 1, 1, 2, 1, 41);   // D = 2, one position
  check_rope(2, 4, 2, 6, 16, 42);  // tables longer than the sequence
}

TEST(Rope, BackwardIsDeterministic) {
  const std::int64_t b = 2, t = 7, h = 3, d = 16;
  std::vector<float> cs(static_cast<std::size_t>(t * d / 2)), sn = cs;
  rope_tables(kokkos_ctx(), 10000.0, view(cs, {t, d / 2}), view(sn, {t, d / 2}));
  auto a = random_vec(static_cast<std::size_t>(b * t * h * d), 43), c = a;
  rope_backward(kokkos_ctx(), view(a, {b, t, h, d}), view(cs, {t, d / 2}), view(sn, {t, d / 2}));
  rope_backward(kokkos_ctx(), view(c, {b, t, h, d}), view(cs, {t, d / 2}), view(sn, {t, d / 2}));
  expect_bitwise(a, c, "rope_backward");
}

// --- RoPE, interleaved pairs on the last columns (multi-head latent attention) ----------

/// Pairs (w-d+2i, w-d+2i+1) of rows of width w rotated by angle(t, i); other columns kept.
std::vector<double> rope_interleaved_ref(const std::vector<double>& x, std::int64_t b,
                                         std::int64_t t_len, std::int64_t h, std::int64_t w,
                                         std::int64_t d, double theta) {
  const auto ang = rope_angles(t_len, d, theta);
  std::vector<double> y = x;
  const std::int64_t half = d / 2, first = w - d;
  for (std::int64_t row = 0; row < b * t_len * h; ++row) {
    const std::int64_t t = (row / h) % t_len;
    for (std::int64_t i = 0; i < half; ++i) {
      const double c = std::cos(ang[t * half + i]), s = std::sin(ang[t * half + i]);
      const double e = x[row * w + first + 2 * i], o = x[row * w + first + 2 * i + 1];
      y[row * w + first + 2 * i] = e * c - o * s;
      y[row * w + first + 2 * i + 1] = o * c + e * s;
    }
  }
  return y;
}

void check_rope_interleaved(std::int64_t b, std::int64_t t_len, std::int64_t h, std::int64_t w,
                            std::int64_t d, std::int64_t table_len, std::uint32_t seed) {
  const double theta = 500.0;
  std::vector<float> cs(static_cast<std::size_t>(table_len * d / 2)), sn = cs;
  rope_tables(kokkos_ctx(), theta, view(cs, {table_len, d / 2}), view(sn, {table_len, d / 2}));
  const auto x0 = random_vec(static_cast<std::size_t>(b * t_len * h * w), seed);
  auto x = x0;
  rope_interleaved_forward(kokkos_ctx(), view(x, {b, t_len, h, w}), view(cs, {table_len, d / 2}),
                           view(sn, {table_len, d / 2}));
  // Table rounding (6e-8) plus two float products and a sum of values <= 1.
  expect_close(x, rope_interleaved_ref(to_double(x0), b, t_len, h, w, d, theta), 3e-7, 0,
               "rope_interleaved_forward");
  // Backward = gradient of L = sum(rope(x) * r): FD of the (linear) double reference.
  const auto r = random_vec(x0.size(), seed + 1);
  auto dx = r;
  rope_interleaved_backward(kokkos_ctx(), view(dx, {b, t_len, h, w}), view(cs, {table_len, d / 2}),
                            view(sn, {table_len, d / 2}));
  const auto g = fd_gradient(to_double(x0), [&](const std::vector<double>& xv) {
    return weighted_sum(rope_interleaved_ref(xv, b, t_len, h, w, d, theta), r);
  });
  expect_close(dx, g, 3e-7, 0, "rope_interleaved_backward");
}

TEST(RopeInterleaved, ForwardAndBackwardMatchReference) {
  check_rope_interleaved(2, 5, 3, 14, 8, 5, 50);  // query heads [nope 6 | rope 8]
  check_rope_interleaved(2, 4, 1, 10, 4, 9, 51);  // [latent 6 | shared key 4], long tables
  check_rope_interleaved(1, 3, 2, 6, 6, 3, 52);   // rope columns only
}

TEST(RopeInterleaved, RejectsTablesWiderThanTheRow) {
  std::vector<float> x(2 * 4), cs(2 * 3), sn = cs;
  EXPECT_THROW(rope_interleaved_forward(kokkos_ctx(), view(x, {1, 2, 1, 4}), view(cs, {2, 3}),
                                        view(sn, {2, 3})),
               Error);
}

// --- causal softmax ----------------------------------------------------------------------

std::vector<double> softmax_ref(const std::vector<double>& s, std::int64_t rows, std::int64_t t_len,
                                double scale) {
  std::vector<double> p(s.size(), 0.0);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t i = r % t_len;
    double m = -std::numeric_limits<double>::infinity();
    for (std::int64_t j = 0; j <= i; ++j)
      m = std::max(m, scale * s[r * t_len + j]);
    double sum = 0;
    for (std::int64_t j = 0; j <= i; ++j)
      sum += std::exp(scale * s[r * t_len + j] - m);
    for (std::int64_t j = 0; j <= i; ++j)
      p[r * t_len + j] = std::exp(scale * s[r * t_len + j] - m) / sum;
  }
  return p;
}

void check_softmax(std::int64_t b, std::int64_t h, std::int64_t t_len, std::uint32_t seed) {
  const float scale = 0.37f;
  const std::int64_t rows = b * h * t_len;
  const Shape shape{b, h, t_len, t_len};
  const auto s = random_vec(static_cast<std::size_t>(rows * t_len), seed, -4.0f, 4.0f);
  auto sc = s;
  std::vector<float> p(s.size(), -1.0f);
  causal_softmax_forward(kokkos_ctx(), view(sc, shape), scale, view(p, shape));
  // Probabilities <= 1; exp in float (1-2 ulp), the sum in double, one multiply.
  const auto ref = softmax_ref(to_double(s), rows, t_len, scale);
  expect_close(p, ref, 1e-7, 1e-6, "probs");
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = r % t_len + 1; j < t_len; ++j)
      ASSERT_EQ(p[r * t_len + j], 0.0f) << "above the diagonal at row " << r << ", col " << j;

  // In place (probs aliases scores): the same bits.
  auto inplace = s;
  causal_softmax_forward(kokkos_ctx(), view(inplace, shape), scale, view(inplace, shape));
  expect_bitwise(inplace, p, "in-place probs");

  // Backward against FD of L = sum(softmax(scores) * r) in double.
  const auto r = random_vec(s.size(), seed + 1);
  auto dp = r;
  std::vector<float> ds(s.size(), -1.0f);
  causal_softmax_backward(kokkos_ctx(), view(p, shape), view(dp, shape), scale, view(ds, shape));
  const auto g = fd_gradient(to_double(s), [&](const std::vector<double>& sv) {
    return weighted_sum(softmax_ref(sv, rows, t_len, scale), r);
  });
  // |ds| <= scale * p * 2 max|r|; float products and a double dot: ~1e-7 absolute.
  expect_close(ds, g, 3e-7, 1e-5, "dscores");
  for (std::int64_t row = 0; row < rows; ++row)
    for (std::int64_t j = row % t_len + 1; j < t_len; ++j)
      ASSERT_EQ(ds[row * t_len + j], 0.0f) << "dscores above the diagonal";

  // dscores aliasing dprobs: the same bits; twice: the same bits (determinism).
  causal_softmax_backward(kokkos_ctx(), view(p, shape), view(dp, shape), scale, view(dp, shape));
  expect_bitwise(dp, ds, "in-place dscores");
}

TEST(CausalSoftmax, ForwardAndBackwardMatchReference) {
  check_softmax(1, 1, 1, 50);  // T = 1: the single probability is 1, its gradient 0
  check_softmax(2, 3, 7, 51);
  check_softmax(1, 2, 20, 52);  // rows longer than the 8 reduction lanes
}

TEST(CausalSoftmax, MaskedEntriesAreNeverRead) {
  // NaN and Inf above the diagonal must not leak into the result (the kernel must not read
  // them); the trap is off so that the test, not a SIGFPE, reports a leak.
  FpTrapOff trap_off;
  const std::int64_t t_len = 9;
  const Shape shape{1, 1, t_len, t_len};
  auto s = random_vec(static_cast<std::size_t>(t_len * t_len), 53);
  auto clean = s;
  for (std::int64_t i = 0; i < t_len; ++i)
    for (std::int64_t j = i + 1; j < t_len; ++j)
      s[i * t_len + j] = (j % 2) ? std::numeric_limits<float>::quiet_NaN()
                                 : std::numeric_limits<float>::infinity();
  std::vector<float> p(s.size()), pc(s.size());
  causal_softmax_forward(kokkos_ctx(), view(s, shape), 1.0f, view(p, shape));
  causal_softmax_forward(kokkos_ctx(), view(clean, shape), 1.0f, view(pc, shape));
  expect_bitwise(p, pc, "probs with garbage above the diagonal");
}

TEST(CausalSoftmax, ExtremeScoresStayFinite) {
  // Max subtraction: scores of +-1e4 (exp would overflow without it).
  const std::int64_t t_len = 4;
  const Shape shape{1, 1, t_len, t_len};
  std::vector<float> s{1e4f, 0, 0, 0, -1e4f, 1e4f, 0, 0, 1e4f, 1e4f, -1e4f, 0, 3, 1e4f, 2, 1e4f};
  std::vector<float> p(s.size());
  causal_softmax_forward(kokkos_ctx(), view(s, shape), 1.0f, view(p, shape));
  expect_close(p, softmax_ref(to_double(s), t_len, t_len, 1.0), 1e-7, 1e-6, "probs");
}

}  // namespace
}  // namespace dst::kernels::test
