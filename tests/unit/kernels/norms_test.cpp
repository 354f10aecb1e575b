// sum_of_squares, first_nonfinite and scale: the kernels of gradient clipping.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <vector>

#include "kernels_test_util.hpp"

namespace dst::kernels::test {
namespace {

TEST(SumOfSquares, ExactOnIntegerData) {
  // Integers |x| <= 1000: every square and every partial sum (< 2e5 * 1e6 = 2e11 < 2^53) is
  // an integer a double holds exactly, whatever the order: the result must be exact.
  // 200004 elements span 25 chunks of the reduction, the last one partial.
  const std::size_t n = 200004;
  std::mt19937 gen(42);
  std::uniform_int_distribution<int> dist(-1000, 1000);
  std::vector<float> x(n);
  std::int64_t expected = 0;
  for (auto& e : x) {
    const int k = dist(gen);
    e = static_cast<float>(k);
    expected += static_cast<std::int64_t>(k) * k;
  }
  EXPECT_EQ(sum_of_squares(kokkos_ctx(), view(x, {static_cast<std::int64_t>(n)})),
            static_cast<double>(expected));
  // Any shape: the same elements as a matrix.
  EXPECT_EQ(sum_of_squares(kokkos_ctx(), view(x, {28572, 7})), static_cast<double>(expected));
}

TEST(SumOfSquares, AccurateOnRandomData) {
  // Against a long double sum: the double sum of n positive terms is within n * 2^-53
  // relative of the exact value (each addition rounds once, relative to a partial sum
  // no larger than the total).
  const std::size_t n = 1 << 20;
  const auto x = random_vec(n, 7, -3.0f, 3.0f);
  long double exact = 0;
  for (float e : x)
    exact += static_cast<long double>(e) * e;
  auto xs = x;
  const double got = sum_of_squares(kokkos_ctx(), view(xs, {static_cast<std::int64_t>(n)}));
  EXPECT_NEAR(got, static_cast<double>(exact), static_cast<double>(exact) * n * 0x1p-53);
  // Order fixed: the same bits again.
  const double again = sum_of_squares(kokkos_ctx(), view(xs, {static_cast<std::int64_t>(n)}));
  EXPECT_EQ(std::memcmp(&got, &again, sizeof got), 0) << "not deterministic";
}

TEST(SumOfSquares, DoubleAccumulationKeepsSmallTerms) {
  // 1 + 2^20 terms of 2^-24 each: a float accumulator would drop every small term
  // (1 + 2^-24 rounds to 1), the double one keeps them all.
  std::vector<float> x(1 + (1 << 20), 0x1p-12f);
  x[0] = 1.0f;
  EXPECT_EQ(sum_of_squares(kokkos_ctx(), view(x, {static_cast<std::int64_t>(x.size())})),
            1.0 + 0x1p-4);
}

TEST(SumOfSquares, EmptyIsZeroAndNonFinitePropagates) {
  EXPECT_EQ(sum_of_squares(kokkos_ctx(), Tensor{nullptr, Shape{0}}), 0.0);
  FpTrapOff trap_off;  // NaN and Inf on purpose
  std::vector<float> x(20000, 1.0f);
  x[12345] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(sum_of_squares(kokkos_ctx(), view(x, {20000})),
            std::numeric_limits<double>::infinity());
  x[19999] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(sum_of_squares(kokkos_ctx(), view(x, {20000}))));
  // Large finite values do not overflow in double (~1.8e77); x^2 + x^2 is exact.
  std::vector<float> big{3e38f, -3e38f};
  const double big2 = static_cast<double>(big[0]) * big[0];
  EXPECT_EQ(sum_of_squares(kokkos_ctx(), view(big, {2})), 2 * big2);
}

// The variant that does not wait: the same reduction, so the same bits, into one slot of an
// f64 buffer (the gradient norm's per-tensor sums); the other slots stay as they were.
TEST(SumOfSquaresInto, SameBitsAsTheBlockingSumIntoItsSlotOnly) {
  const auto ctx = kokkos_ctx();
  const std::int64_t sizes[] = {1, 13, 8191, 8193, 200004};
  std::vector<double> out(6, -1.0);
  const Tensor out_t{out.data(), Shape{6}, DType::f64};
  std::uint32_t seed = 30;
  for (std::size_t i = 0; i < std::size(sizes); ++i) {
    auto x = random_vec(static_cast<std::size_t>(sizes[i]), seed++, -3.0f, 3.0f);
    const double ref = sum_of_squares(ctx, view(x, {sizes[i]}));
    sum_of_squares_into(ctx, view(x, {sizes[i]}), out_t, static_cast<std::int64_t>(i));
    EXPECT_EQ(std::memcmp(&out[i], &ref, sizeof ref), 0) << "n=" << sizes[i];
    EXPECT_EQ(out[i + 1], -1.0) << "slot " << i + 1 << " written";
  }
  sum_of_squares_into(ctx, Tensor{nullptr, Shape{0}}, out_t, 5);  // empty: +0
  EXPECT_EQ(out[5], 0.0);
  EXPECT_FALSE(std::signbit(out[5]));

  std::vector<float> x(10, 1.0f);
  EXPECT_THROW(sum_of_squares_into(ctx, view(x, {10}), out_t, 6), Error);
  EXPECT_THROW(sum_of_squares_into(ctx, view(x, {10}), out_t, -1), Error);
  std::vector<float> wrong(6);
  EXPECT_THROW(sum_of_squares_into(ctx, view(x, {10}), view(wrong, {6}), 0), Error);
  EXPECT_THROW(
      sum_of_squares_into(ctx, view(x, {10}), Tensor{out.data(), Shape{2, 3}, DType::f64}, 0),
      Error);
}

TEST(FirstNonfinite, FindsTheFirstNanOrInf) {
  const auto ctx = kokkos_ctx();
  std::vector<float> x = random_vec(100000, 3, -1e30f, 1e30f);
  x[17] = std::numeric_limits<float>::max();  // finite, however large
  x[18] = std::numeric_limits<float>::denorm_min();
  EXPECT_EQ(first_nonfinite(ctx, view(x, {100000})), -1);
  EXPECT_EQ(first_nonfinite(ctx, Tensor{nullptr, Shape{0}}), -1);

  FpTrapOff trap_off;  // NaN and Inf on purpose
  x[90000] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(first_nonfinite(ctx, view(x, {100000})), 90000);
  x[70001] = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(first_nonfinite(ctx, view(x, {100000})), 70001);
  x[99999] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(first_nonfinite(ctx, view(x, {1000, 100})), 70001);  // flat index, any shape
  x[0] = std::numeric_limits<float>::signaling_NaN();
  EXPECT_EQ(first_nonfinite(ctx, view(x, {100000})), 0);
  // A NaN with a payload and the sign bit set is still a NaN.
  const std::uint32_t neg_nan_bits = 0xffc01234u;
  float neg_nan;
  std::memcpy(&neg_nan, &neg_nan_bits, sizeof neg_nan);
  std::vector<float> y{1.0f, 2.0f, neg_nan};
  EXPECT_EQ(first_nonfinite(ctx, view(y, {3})), 2);
}

// The Kokkos search works in chunks of 4096 elements (a vectorised screen, then the exact
// position): hits at a chunk's first and last element, two in one chunk, and one in the
// last, partial chunk only.
TEST(FirstNonfinite, ChunkEdges) {
  const auto ctx = kokkos_ctx();
  FpTrapOff trap_off;
  const float inf = std::numeric_limits<float>::infinity();
  for (const std::int64_t at : {4095L, 4096L, 8191L, 99999L}) {
    std::vector<float> x = random_vec(100000, 5, -1.0f, 1.0f);
    x[static_cast<std::size_t>(at)] = inf;
    EXPECT_EQ(first_nonfinite(ctx, view(x, {100000})), at);
  }
  std::vector<float> x = random_vec(100000, 6, -1.0f, 1.0f);
  x[4100] = std::numeric_limits<float>::quiet_NaN();
  x[4097] = -inf;  // same chunk, earlier
  x[9000] = inf;
  EXPECT_EQ(first_nonfinite(ctx, view(x, {100000})), 4097);
  EXPECT_EQ(first_nonfinite(ctx, view(x, {4097})), -1);  // stops just before it
}

// The scan that does not wait: a series lowers one flag to offset + the first position,
// whatever the order of the calls; finite ranges and empty ones leave it alone.
TEST(FirstNonfiniteMin, LowersTheFlagToTheFirstOffsetOfASeries) {
  const auto ctx = kokkos_ctx();
  FpTrapOff trap_off;
  std::vector<float> x = random_vec(3000, 5, -1.0f, 1.0f);
  x[2500] = std::numeric_limits<float>::quiet_NaN();
  x[1200] = std::numeric_limits<float>::infinity();
  x[1300] = -std::numeric_limits<float>::infinity();
  std::vector<std::uint64_t> flag{std::numeric_limits<std::uint64_t>::max()};
  const Tensor f{flag.data(), Shape{1}, DType::u64};
  const auto range = [&](std::size_t begin, std::size_t end) {
    return Tensor{x.data() + begin, Shape{static_cast<std::int64_t>(end - begin)}};
  };
  first_nonfinite_min(ctx, range(2000, 3000), 2000, f);  // the last range first, as backward
  EXPECT_EQ(flag[0], 2500u);
  first_nonfinite_min(ctx, range(0, 1000), 0, f);  // finite: unchanged
  EXPECT_EQ(flag[0], 2500u);
  first_nonfinite_min(ctx, range(1000, 2000), 1000, f);
  EXPECT_EQ(flag[0], 1200u);
  first_nonfinite_min(ctx, range(2000, 3000), 2000, f);  // a later, higher hit: unchanged
  EXPECT_EQ(flag[0], 1200u);
  first_nonfinite_min(ctx, Tensor{nullptr, Shape{0}}, 0, f);
  EXPECT_EQ(flag[0], 1200u);
  std::vector<std::int64_t> wrong(1);
  EXPECT_THROW(
      first_nonfinite_min(ctx, range(0, 10), 0, Tensor{wrong.data(), Shape{1}, DType::i64}),
      dst::Error);
}

TEST(Scale, CorrectlyRoundedProduct) {
  // One float multiplication: the exact product (exact in double: 24 + 24 bits) rounded
  // once to float, bit for bit.
  auto x = random_vec(1001, 5, -1e3f, 1e3f);
  const auto x0 = x;
  const float factor = 0.3f;
  scale(kokkos_ctx(), view(x, {7, 143}), factor);
  std::vector<float> expected(x0.size());
  for (std::size_t i = 0; i < x0.size(); ++i)
    expected[i] = static_cast<float>(static_cast<double>(x0[i]) * static_cast<double>(factor));
  expect_bitwise(x, expected, "x * 0.3");
  expect_error([&] { scale(kokkos_ctx(), view(x, {1001}), std::nanf("")); },
               {"kernels::scale", "factor", "finite"});
  std::vector<std::int32_t> ints(4);
  expect_error([&] { scale(kokkos_ctx(), view(ints, {4}), 2.0f); }, {"kernels::scale", "x", "f32"});
}

}  // namespace
}  // namespace dst::kernels::test
