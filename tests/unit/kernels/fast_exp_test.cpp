// The back end's vectorisable exp (kernels/kokkos/detail/common.hpp) against double exp:
// the softmax, cross-entropy and SwiGLU tolerances above assume its error bound; and its
// integer-keyed row max against a plain float max.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/kokkos/detail/common.hpp"

namespace {

using dst::kernels::kokkos_backend::detail::row_max;
using dst::kernels::kokkos_backend::detail::math::fast_exp;
using dst::kernels::kokkos_backend::detail::math::sigmoid;

float bits_to_float(const std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

std::uint32_t to_bits(const float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

TEST(FastExp, WithinTwoUlpOverTheNormalRange) {
  // Every 1021st float bit pattern of each sign up to the range ends (~1.1e6 values per
  // sign: every binade from 1e-45 to 88 sampled densely; all 2.2e9 would take minutes).
  double worst = 0;
  float worst_x = 0;
  const auto check = [&](float x) {
    const double e = std::exp(static_cast<double>(x));
    const double ulp = std::ldexp(1.0, std::ilogb(e) - 23);
    const double err = std::fabs(static_cast<double>(fast_exp(x)) - e) / ulp;
    if (err > worst) worst = err, worst_x = x;
  };
  const auto from_bits = [](std::uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  };
  for (std::uint32_t u = 0; from_bits(u) < 88.72f; u += 1021)
    check(from_bits(u));
  for (std::uint32_t u = 0x80000000u; from_bits(u) > -87.33f; u += 1021)
    check(from_bits(u));
  check(88.72f);
  check(-87.33f);
  EXPECT_LE(worst, 2.0) << "worst error " << worst << " ulp at x = " << worst_x;
  RecordProperty("worst_ulp", std::to_string(worst));
}

TEST(FastExp, ExactPointsAndRangeEnds) {
  EXPECT_EQ(fast_exp(0.0f), 1.0f);  // softmax relies on exp(0) = 1: the sum is >= 1
  EXPECT_EQ(fast_exp(-100.0f), 0.0f);
  EXPECT_EQ(fast_exp(-1e30f), 0.0f);
  EXPECT_EQ(fast_exp(100.0f), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isfinite(fast_exp(88.7f)));
  EXPECT_GT(fast_exp(-87.3f), 0.0f);
  EXPECT_EQ(sigmoid(-1e30f), 0.0f);
  EXPECT_EQ(sigmoid(1e30f), 1.0f);
  EXPECT_EQ(sigmoid(0.0f), 0.5f);
}

TEST(RowMax, ExactOverEverySignMagnitudeAndLength) {
  // Random floats of every binade and sign (subnormals, zeros of both signs, infinities)
  // in rows of every length 1..70 and every start: the same bits as a scalar max.
  std::mt19937 gen(11);
  std::uniform_int_distribution<std::uint32_t> any_bits;
  const float specials[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::denorm_min(),
                            -std::numeric_limits<float>::denorm_min(),
                            std::numeric_limits<float>::max(),
                            -std::numeric_limits<float>::max()};
  std::vector<float> row(80);
  for (int trial = 0; trial < 2000; ++trial) {
    for (auto& x : row) {
      // Sign, a biased exponent 0..254 (never NaN) and a mantissa, all at random.
      const std::uint32_t u = any_bits(gen);
      const std::uint32_t finite = (u & 0x807fffffu) | ((u >> 23) % 255u) << 23;
      x = (u % 7 == 0) ? specials[(u >> 3) % 8] : bits_to_float(finite);
    }
    if (trial % 3 == 0)  // rows of negatives only: the max is the least negative
      for (auto& x : row)
        x = -std::fabs(x);
    const long n = 1 + trial % 70;
    const long start = trial % 10;
    float want = row[static_cast<std::size_t>(start)];
    for (long j = start + 1; j < start + n; ++j)
      want = std::max(want, row[static_cast<std::size_t>(j)]);
    const float got =
        row_max(n, [&](const long j) { return row[static_cast<std::size_t>(start + j)]; });
    if (want == 0.0f) {
      EXPECT_EQ(got, 0.0f) << "n " << n << " trial " << trial;  // +0 or -0, either is exact
    } else {
      EXPECT_EQ(to_bits(got), to_bits(want)) << "n " << n << " trial " << trial;
    }
  }
  // A row of -inf only; a NaN with the sign bit clear is the maximum.
  EXPECT_EQ(row_max(3, [](long) { return -std::numeric_limits<float>::infinity(); }),
            -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(
      row_max(5, [](long j) { return j == 3 ? std::numeric_limits<float>::quiet_NaN() : 1.0f; })));
}

}  // namespace
