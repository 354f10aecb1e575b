// core/rng: Philox4x32-10 known answers, the (seed, stream, index) contract, and the
// statistics of uniform01 / normal.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "core/rng.hpp"

namespace {

using dst::core::philox4x32;
using Block = std::array<std::uint32_t, 4>;

// Known-answer vectors of Random123 (kat_vectors, philox4x32_10).
TEST(Philox, Random123KnownAnswers) {
  EXPECT_EQ(philox4x32({0, 0, 0, 0}, {0, 0}),
            (Block{0x6627e8d5U, 0xe169c58dU, 0xbc57ac4cU, 0x9b00dbd8U}));
  EXPECT_EQ(
      philox4x32({0xffffffffU, 0xffffffffU, 0xffffffffU, 0xffffffffU}, {0xffffffffU, 0xffffffffU}),
      (Block{0x408f276dU, 0x41c83b0eU, 0xa20bc7c6U, 0x6d5451fdU}));
  EXPECT_EQ(
      philox4x32({0x243f6a88U, 0x85a308d3U, 0x13198a2eU, 0x03707344U}, {0xa4093822U, 0x299f31d0U}),
      (Block{0xd16cfe09U, 0x94fdccebU, 0x5001e420U, 0x24126ea1U}));
}

// FNV-1a 64 reference values (Fowler/Noll/Vo test suite).
TEST(HashName, Fnv1a64KnownAnswers) {
  EXPECT_EQ(dst::core::hash_name(""), 0xcbf29ce484222325ULL);
  EXPECT_EQ(dst::core::hash_name("a"), 0xaf63dc4c8601ec8cULL);
  EXPECT_EQ(dst::core::hash_name("foobar"), 0x85944171f73967e8ULL);
  EXPECT_NE(dst::core::hash_name("layers.0.attn.wq"), dst::core::hash_name("layers.0.attn.wk"));
}

// The mapping documented in rng.hpp: key = seed halves (lo, hi), counter = (index lo,
// index hi, stream lo, stream hi). The third known answer has four distinct words, so a
// swapped half or swapped stream/index fails here.
TEST(Rng, UniformFollowsTheDocumentedMapping) {
  const std::uint64_t seed = 0x299f31d0a4093822ULL;
  const std::uint64_t index = 0x85a308d3243f6a88ULL;
  const std::uint64_t stream = 0x0370734413198a2eULL;
  EXPECT_EQ(dst::core::uniform01(seed, stream, index),
            static_cast<float>(0xd16cfe09U >> 8) * 0x1p-24F);
  EXPECT_EQ(dst::core::uniform01(0, 0, 0), static_cast<float>(0x6627e8d5U >> 8) * 0x1p-24F);
  EXPECT_EQ(dst::core::uniform01(~0ULL, ~0ULL, ~0ULL),
            static_cast<float>(0x408f276dU >> 8) * 0x1p-24F);
}

TEST(Rng, NormalFollowsTheDocumentedMapping) {
  // Block for (0, 0, 0): the first known answer.
  const double u1 =
      static_cast<double>(((0x6627e8d5ULL << 32 | 0xe169c58dULL) >> 11) + 1) * 0x1p-53;
  const double u2 = static_cast<double>((0xbc57ac4cULL << 32 | 0x9b00dbd8ULL) >> 11) * 0x1p-53;
  const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  // Same formula, so equal up to libm's last-bit differences between call sites.
  EXPECT_FLOAT_EQ(dst::core::normal(0, 0, 0), static_cast<float>(z));
}

TEST(Rng, UniformIsIn01With24Bits) {
  for (std::uint64_t i = 0; i < 200000; ++i) {
    const float u = dst::core::uniform01(42, 7, i);
    ASSERT_GE(u, 0.0F) << i;
    ASSERT_LT(u, 1.0F) << i;
    const float scaled = u * 0x1p24F;  // exact: u is a multiple of 2^-24
    ASSERT_EQ(scaled, std::floor(scaled)) << "not a multiple of 2^-24 at index " << i;
  }
}

// Bounds are 5 standard errors of the statistic, so a correct generator fails with
// probability < 1e-6 per check (and the draws are fixed, so the test is deterministic).
TEST(Rng, UniformMeanAndVariance) {
  constexpr int n = 1000000;
  double s = 0.0, s2 = 0.0;
  for (int i = 0; i < n; ++i) {
    const double u = dst::core::uniform01(1234, 1, static_cast<std::uint64_t>(i));
    s += u;
    s2 += u * u;
  }
  const double mean = s / n;
  const double var = s2 / n - mean * mean;
  EXPECT_NEAR(mean, 0.5, 5.0 * std::sqrt(1.0 / 12.0 / n));
  // Var of (u - 1/2)^2 for U(0,1) is 1/180.
  EXPECT_NEAR(var, 1.0 / 12.0, 5.0 * std::sqrt(1.0 / 180.0 / n));
}

TEST(Rng, NormalMeanVarianceAndShape) {
  constexpr int n = 1000000;
  double s = 0.0, s2 = 0.0;
  int within_1sigma = 0;
  for (int i = 0; i < n; ++i) {
    const double z = dst::core::normal(1234, 2, static_cast<std::uint64_t>(i));
    s += z;
    s2 += z * z;
    within_1sigma += std::fabs(z) < 1.0 ? 1 : 0;
  }
  const double mean = s / n;
  const double var = s2 / n - mean * mean;
  EXPECT_NEAR(mean, 0.0, 5.0 / std::sqrt(n));              // SE of the mean: 1/sqrt(n)
  EXPECT_NEAR(var, 1.0, 5.0 * std::sqrt(2.0 / n));         // SE of the variance: sqrt(2/n)
  const double p1 = 0.682689492137;                        // P(|Z| < 1)
  EXPECT_NEAR(static_cast<double>(within_1sigma) / n, p1,  // binomial SE
              5.0 * std::sqrt(p1 * (1.0 - p1) / n));
}

TEST(Rng, StreamsAndSeedsAreIndependent) {
  constexpr int n = 100000;
  std::vector<double> a(n), b(n), c(n);
  int same = 0;
  for (int i = 0; i < n; ++i) {
    const auto idx = static_cast<std::uint64_t>(i);
    a[static_cast<std::size_t>(i)] = dst::core::uniform01(9, 0, idx) - 0.5;
    b[static_cast<std::size_t>(i)] = dst::core::uniform01(9, 1, idx) - 0.5;
    c[static_cast<std::size_t>(i)] = dst::core::uniform01(10, 0, idx) - 0.5;
    same += a[static_cast<std::size_t>(i)] == b[static_cast<std::size_t>(i)] ? 1 : 0;
  }
  // 24-bit values: equal by chance with probability 2^-24 each.
  EXPECT_LE(same, 2);
  auto corr = [](const std::vector<double>& x, const std::vector<double>& y) {
    const double xy = std::inner_product(x.begin(), x.end(), y.begin(), 0.0);
    const double xx = std::inner_product(x.begin(), x.end(), x.begin(), 0.0);
    const double yy = std::inner_product(y.begin(), y.end(), y.begin(), 0.0);
    return xy / std::sqrt(xx * yy);
  };
  // The sample correlation of independent sequences has SE 1/sqrt(n).
  EXPECT_LT(std::fabs(corr(a, b)), 5.0 / std::sqrt(n)) << "streams 0 and 1";
  EXPECT_LT(std::fabs(corr(a, c)), 5.0 / std::sqrt(n)) << "seeds 9 and 10";
  // Neighbouring indices of one stream, too.
  std::vector<double> shifted(a.begin() + 1, a.end());
  shifted.push_back(a.front());
  EXPECT_LT(std::fabs(corr(a, shifted)), 5.0 / std::sqrt(n)) << "index i and i + 1";
}

TEST(Rng, ValueDoesNotDependOnCallOrder) {
  constexpr std::uint64_t n = 4096;
  std::vector<float> forward(n), shuffled(n);
  for (std::uint64_t i = 0; i < n; ++i)
    forward[i] = dst::core::normal(5, 3, i);
  std::vector<std::uint64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(99));
  for (const std::uint64_t i : order) {
    shuffled[i] = dst::core::normal(5, 3, i);
    (void)dst::core::uniform01(5, 4, i);  // interleaved draws from another stream
  }
  EXPECT_EQ(forward, shuffled);  // bitwise: a pure function of (seed, stream, index)
}

}  // namespace
