// The back end's vectorisable exp (kernels/kokkos/detail/common.hpp) against double exp:
// the softmax, cross-entropy and SwiGLU tolerances above assume its error bound.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "kernels/kokkos/detail/common.hpp"

namespace {

using dst::kernels::kokkos_backend::detail::math::fast_exp;
using dst::kernels::kokkos_backend::detail::math::sigmoid;

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

}  // namespace
