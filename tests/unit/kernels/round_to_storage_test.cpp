// round_to_storage: the emulated 16-bit storage of training.precision bf16 / fp16
// (docs/precision.md), against core/bf16.hpp's scalar conversions and known values.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "core/bf16.hpp"
#include "fp_trap.hpp"
#include "kernels_test_util.hpp"

namespace dst::kernels::test {
namespace {

std::uint32_t bits_of(float f) {
  std::uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float float_of(std::uint32_t u) {
  float f = 0.0F;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

/// Finite floats spread over every exponent (a stride through the bit patterns), plus the
/// boundary values of both formats.
std::vector<float> sample_floats() {
  std::vector<float> x;
  for (std::uint64_t u = 0; u < 0x7f800000ULL; u += 40009) {  // prime stride: all low bits
    x.push_back(float_of(static_cast<std::uint32_t>(u)));
    x.push_back(-float_of(static_cast<std::uint32_t>(u)));
  }
  for (const float v : {65504.0F, 65519.99F, 65520.0F, 0x1p-24F, 0x1p-25F, 3 * 0x1p-25F, 0x1p-14F,
                        1.0F + 0x1p-11F, 1.0F + 0x1p-8F, 0.0F, -0.0F})
    x.push_back(v);
  return x;
}

TEST(RoundToStorage, BitIdenticalToTheScalarConversions) {
  const FpTrapOff no_trap;  // the f16 side overflows to inf on purpose
  const std::vector<float> x = sample_floats();
  const auto n = static_cast<std::int64_t>(x.size());
  for (const DType storage : {DType::bf16, DType::f16}) {
    std::vector<float> y = x;
    round_to_storage(kokkos_ctx(), view(y, {n}), storage);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const float want = storage == DType::bf16 ? bf16::from_float(x[i]).to_float()
                                                : f16::from_float(x[i]).to_float();
      if (bits_of(y[i]) != bits_of(want) && ++bad < 5)
        ADD_FAILURE() << dtype_name(storage) << ": " << x[i] << " -> " << y[i] << ", want " << want;
    }
    EXPECT_EQ(bad, 0u) << dtype_name(storage);
  }
}

TEST(RoundToStorage, KnownValues) {
  const FpTrapOff no_trap;
  // f16: largest finite, the overflow boundary (ties to even = inf), a subnormal tie, the
  // smallest subnormal, underflow to zero, ties to even at 1.
  std::vector<float> h = {65504.0F,           std::nextafter(65520.0F, 0.0F),
                          65520.0F,           -1e6F,
                          3 * 0x1p-25F,       0x1p-24F,
                          0x1p-26F,           1.0F + 0x1p-11F,
                          1.0F + 3 * 0x1p-11F};
  round_to_storage(kokkos_ctx(), view(h, {static_cast<std::int64_t>(h.size())}), DType::f16);
  EXPECT_EQ(h[0], 65504.0F);
  EXPECT_EQ(h[1], 65504.0F);
  EXPECT_EQ(h[2], std::numeric_limits<float>::infinity());
  EXPECT_EQ(h[3], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(h[4], 2 * 0x1p-24F);  // 1.5 subnormal ulps: tie -> even (2)
  EXPECT_EQ(h[5], 0x1p-24F);
  EXPECT_EQ(h[6], 0.0F);
  EXPECT_EQ(h[7], 1.0F);
  EXPECT_EQ(h[8], 1.0F + 4 * 0x1p-11F);
  // bf16: 8 significant bits, float's range (no overflow at 65520), ties to even.
  std::vector<float> b = {1.0F + 0x1p-8F, 1.0F + 3 * 0x1p-8F, 65520.0F, 0.1F};
  round_to_storage(kokkos_ctx(), view(b, {4}), DType::bf16);
  EXPECT_EQ(b[0], 1.0F);
  EXPECT_EQ(b[1], 1.0F + 4 * 0x1p-8F);
  EXPECT_EQ(b[2], 65536.0F);
  EXPECT_EQ(bits_of(b[3]), 0x3dcd0000U);  // 0.1f = 0x3dcccccd rounds up
}

TEST(RoundToStorage, F32IsTheIdentityAndOtherTypesAreRefused) {
  std::vector<float> x = {0.1F, 1e-30F, 123456.789F};
  const std::vector<float> before = x;
  round_to_storage(kokkos_ctx(), view(x, {3}), DType::f32);
  EXPECT_EQ(std::memcmp(x.data(), before.data(), sizeof(float) * 3), 0);
  EXPECT_THROW(round_to_storage(kokkos_ctx(), view(x, {3}), DType::i32), Error);
}

}  // namespace
}  // namespace dst::kernels::test
