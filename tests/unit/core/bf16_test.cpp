// core/bf16: float <-> bfloat16 / binary16 conversions. Exhaustive over the 16-bit side,
// and the rounding of float -> 16 bits checked against an independent reference (nearest
// representable value by search, ties to the even bit pattern).
#include <gtest/gtest.h>
#include "fp_trap.hpp"

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/bf16.hpp"

namespace {

using dst::bf16;
using dst::f16;

using FpTrapDisabled = dst::test::FpTrapDisabled;

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

bool is_nan_bits(std::uint32_t u) {
  return (u & 0x7fffffffU) > 0x7f800000U;
}

// The 16-bit formats as (exponent bits, mantissa bits): the reference below is written
// once for both and shares no code with the implementation.
struct Format {
  int exp_bits, mant_bits;
  std::uint16_t inf() const {
    return static_cast<std::uint16_t>(((1U << exp_bits) - 1U) << mant_bits);
  }
  std::uint16_t quiet() const { return static_cast<std::uint16_t>(1U << (mant_bits - 1)); }
  // Exact value of a non-negative, non-NaN pattern; the infinity pattern counts as
  // 2^(emax + 1), the value IEEE rounding compares against to decide overflow.
  double value(std::uint16_t p) const {
    const int bias = (1 << (exp_bits - 1)) - 1;
    const unsigned e = p >> mant_bits;
    const unsigned m = p & ((1U << mant_bits) - 1U);
    if (e == 0) return std::ldexp(static_cast<double>(m), 1 - bias - mant_bits);
    return std::ldexp(1.0 + std::ldexp(static_cast<double>(m), -mant_bits),
                      static_cast<int>(e) - bias);
  }
  // Round-to-nearest-even of a non-NaN float, by binary search over the patterns.
  std::uint16_t round(float f) const {
    const std::uint16_t sign = std::signbit(f) ? 0x8000U : 0U;
    const double a = std::fabs(static_cast<double>(f));
    std::uint16_t lo = 0, hi = inf();
    if (a >= value(hi)) return static_cast<std::uint16_t>(sign | hi);
    while (hi - lo > 1) {  // invariant: value(lo) <= a < value(hi)
      const auto mid = static_cast<std::uint16_t>((lo + hi) / 2);
      (value(mid) <= a ? lo : hi) = mid;
    }
    const double dlo = a - value(lo), dhi = value(hi) - a;
    const std::uint16_t p = dlo < dhi ? lo : dhi < dlo ? hi : ((lo & 1U) == 0 ? lo : hi);
    return static_cast<std::uint16_t>(sign | p);
  }
};

constexpr Format kBf16{8, 7};
constexpr Format kF16{5, 10};

template <class T>
std::uint16_t from_bits_of(float f) {
  return T::from_float(f).bits;
}

template <class T>
float to_float_of(std::uint16_t b) {
  return T{b}.to_float();
}

// Every 16-bit pattern: to_float is exact (checked against the format's value formula)
// and from_float gives the pattern back; NaNs stay NaN with their sign, come back quiet.
template <class T>
void exhaustive_round_trip(const Format& fmt, const char* name) {
  const FpTrapDisabled no_trap;
  int bad = 0;
  for (std::uint32_t b = 0; b <= 0xffffU; ++b) {
    const auto p = static_cast<std::uint16_t>(b);
    const float f = to_float_of<T>(p);
    const std::uint16_t mag = p & 0x7fffU;
    const bool nan16 = mag > fmt.inf();
    const std::uint16_t back = from_bits_of<T>(f);
    if (nan16) {
      const bool ok = is_nan_bits(bits_of(f)) && (bits_of(f) & 0x00400000U) != 0 &&
                      (back & 0x7fffU) > fmt.inf() && (back & fmt.quiet()) != 0 &&
                      (back & 0x8000U) == (p & 0x8000U);
      if (!ok && bad++ < 5)
        ADD_FAILURE() << name << " NaN 0x" << std::hex << b << " -> float 0x" << bits_of(f)
                      << " -> 0x" << back;
      continue;
    }
    const double expect = mag == fmt.inf() ? HUGE_VAL : fmt.value(mag);
    const double got = std::fabs(static_cast<double>(f));
    const bool ok = got == expect && std::signbit(f) == ((p & 0x8000U) != 0) && back == p;
    if (!ok && bad++ < 5)
      ADD_FAILURE() << name << " 0x" << std::hex << b << " -> " << f << " (expected " << expect
                    << ") -> 0x" << back;
  }
  EXPECT_EQ(bad, 0);
}

TEST(Bf16, ExhaustiveRoundTrip) {
  exhaustive_round_trip<bf16>(kBf16, "bf16");
}
TEST(F16, ExhaustiveRoundTrip) {
  exhaustive_round_trip<f16>(kF16, "f16");
}

// from_float against the reference on floats built to sit on and next to rounding
// boundaries: every high part of the float combined with low parts that are exact, one
// below / at / one above the halfway point, and random.
template <class T>
void rounding_matches_reference(const Format& fmt, int dropped_bits, const char* name) {
  std::mt19937 gen(7);
  const std::uint32_t half = 1U << (dropped_bits - 1);
  const std::uint32_t low_mask = (1U << dropped_bits) - 1U;
  int bad = 0;
  for (std::uint32_t high = 0; high < (1U << (32 - dropped_bits)); ++high) {
    const std::uint32_t lows[] = {
        0, 1, half - 1, half, half + 1, low_mask, static_cast<std::uint32_t>(gen() & low_mask)};
    for (const std::uint32_t low : lows) {
      const std::uint32_t u = high << dropped_bits | low;
      if (is_nan_bits(u)) continue;
      const float f = float_of(u);
      const std::uint16_t got = from_bits_of<T>(f);
      const std::uint16_t want = fmt.round(f);
      if (got != want && bad++ < 5)
        ADD_FAILURE() << name << "(0x" << std::hex << u << " = " << f << ") = 0x" << got
                      << ", reference 0x" << want;
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(Bf16, RoundingMatchesReference) {
  rounding_matches_reference<bf16>(kBf16, 16, "bf16");
}
// For normal halves 13 float bits are dropped; the subnormal range is covered below.
TEST(F16, RoundingMatchesReference) {
  rounding_matches_reference<f16>(kF16, 13, "f16");
}

TEST(F16, SubnormalRoundingMatchesReference) {
  // Every float in [2^-26, 2^-14) with a stride (1.2e6 values), plus the exact halfway
  // points (q + 1/2) 2^-24 and their neighbours.
  int bad = 0;
  auto check = [&](float f) {
    for (const float s : {f, -f}) {
      const std::uint16_t got = f16::from_float(s).bits, want = kF16.round(s);
      if (got != want && bad++ < 5)
        ADD_FAILURE() << "f16(" << s << ") = 0x" << std::hex << got << ", reference 0x" << want;
    }
  };
  for (std::uint32_t u = bits_of(0x1p-26F); u < bits_of(0x1p-14F); u += 83)
    check(float_of(u));
  for (int q = 0; q < 1024; ++q) {
    const float mid = (static_cast<float>(q) + 0.5F) * 0x1p-24F;
    check(mid);
    check(std::nextafter(mid, 0.0F));
    check(std::nextafter(mid, 1.0F));
  }
  EXPECT_EQ(bad, 0);
}

TEST(Bf16, TiesToEvenAndSpecialValues) {
  const FpTrapDisabled no_trap;
  EXPECT_EQ(bf16::from_float(1.0F).bits, 0x3f80);
  EXPECT_EQ(bf16::from_float(float_of(0x3f808000U)).bits, 0x3f80);  // 1 + 2^-8: tie, down to even
  EXPECT_EQ(bf16::from_float(float_of(0x3f818000U)).bits, 0x3f82);  // tie, up to even
  EXPECT_EQ(bf16::from_float(float_of(0x3f808001U)).bits, 0x3f81);  // just above the tie
  EXPECT_EQ(bf16::from_float(-0.0F).bits, 0x8000);
  EXPECT_EQ(bf16::from_float(HUGE_VALF).bits, 0x7f80);
  EXPECT_EQ(bf16::from_float(-HUGE_VALF).bits, 0xff80);
  // Largest finite bf16 (0x7f7f = 3.3895e38) and the overflow boundary half an ulp above.
  EXPECT_EQ(bf16::from_float(float_of(0x7f7f0000U)).bits, 0x7f7f);
  EXPECT_EQ(bf16::from_float(float_of(0x7f7f7fffU)).bits, 0x7f7f);
  EXPECT_EQ(bf16::from_float(float_of(0x7f7f8000U)).bits, 0x7f80);  // tie, odd -> inf
  EXPECT_EQ(bf16::from_float(std::numeric_limits<float>::max()).bits, 0x7f80);
  // NaN stays NaN, including a signalling NaN whose payload lies only in dropped bits
  // (plain truncation would turn it into infinity).
  EXPECT_EQ(bf16::from_float(std::numeric_limits<float>::quiet_NaN()).bits & 0x7fc0, 0x7fc0);
  EXPECT_EQ(bf16::from_float(float_of(0x7f800001U)).bits, 0x7fc0);
  EXPECT_EQ(bf16::from_float(float_of(0xff800001U)).bits, 0xffc0);
  EXPECT_TRUE(std::isnan(bf16{0x7f81}.to_float()));
  EXPECT_EQ(bits_of(bf16{0x8000}.to_float()), 0x80000000U);  // -0
  // Float subnormals are representable in bf16 (same exponent range).
  EXPECT_EQ(bf16::from_float(float_of(0x00010000U)).bits, 0x0001);
}

TEST(F16, TiesToEvenAndSpecialValues) {
  const FpTrapDisabled no_trap;
  EXPECT_EQ(f16::from_float(1.0F).bits, 0x3c00);
  EXPECT_EQ(f16::from_float(1.0F + 0x1p-11F).bits, 0x3c00);      // tie, down to even
  EXPECT_EQ(f16::from_float(1.0F + 3 * 0x1p-11F).bits, 0x3c02);  // tie, up to even
  EXPECT_EQ(f16::from_float(-0.0F).bits, 0x8000);
  EXPECT_EQ(f16::from_float(HUGE_VALF).bits, 0x7c00);
  EXPECT_EQ(f16::from_float(-HUGE_VALF).bits, 0xfc00);
  // Largest finite half 65504; 65520 is halfway to 2^16 and rounds to inf (even).
  EXPECT_EQ(f16::from_float(65504.0F).bits, 0x7bff);
  EXPECT_EQ(f16::from_float(std::nextafter(65520.0F, 0.0F)).bits, 0x7bff);
  EXPECT_EQ(f16::from_float(65520.0F).bits, 0x7c00);
  EXPECT_EQ(f16::from_float(-65520.0F).bits, 0xfc00);
  EXPECT_EQ(f16::from_float(1e10F).bits, 0x7c00);
  // Subnormals: smallest 2^-24, largest 1023 * 2^-24, and the ties below and between.
  EXPECT_EQ(f16::from_float(0x1p-24F).bits, 0x0001);
  EXPECT_EQ(f16::from_float(0x1p-25F).bits, 0x0000);  // tie with 0 -> 0
  EXPECT_EQ(f16::from_float(std::nextafter(0x1p-25F, 1.0F)).bits, 0x0001);
  EXPECT_EQ(f16::from_float(-0x1p-25F).bits, 0x8000);
  EXPECT_EQ(f16::from_float(3 * 0x1p-25F).bits, 0x0002);  // 1.5 ulp: tie -> 2
  EXPECT_EQ(f16::from_float(1023 * 0x1p-24F).bits, 0x03ff);
  EXPECT_EQ(f16::from_float(0x1p-14F).bits, 0x0400);            // smallest normal
  EXPECT_EQ(f16::from_float(1023.5F * 0x1p-24F).bits, 0x0400);  // rounds up into normals
  EXPECT_EQ(f16{0x0001}.to_float(), 0x1p-24F);
  EXPECT_EQ(f16{0x03ff}.to_float(), 1023 * 0x1p-24F);
  EXPECT_EQ(bits_of(f16{0x8000}.to_float()), 0x80000000U);
  // NaN: quiet, sign kept, never infinity.
  EXPECT_EQ(f16::from_float(std::numeric_limits<float>::quiet_NaN()).bits & 0x7e00, 0x7e00);
  EXPECT_EQ(f16::from_float(float_of(0x7f800001U)).bits, 0x7e00);
  EXPECT_EQ(f16::from_float(float_of(0xff800001U)).bits, 0xfe00);
  EXPECT_TRUE(std::isnan(f16{0x7c01}.to_float()));
}

}  // namespace

// round_to_bf16 / round_to_f16: a store and a load in one, the values the emulated 16-bit
// storage of training.precision bf16 / fp16 keeps (docs/precision.md).
namespace {
TEST(RoundToStorageScalar, KnownValues) {
  const FpTrapDisabled no_trap;
  // binary16: largest finite, overflow to inf at 65520 (tie to the even neighbour, 2^16),
  // subnormals (multiples of 2^-24) with their ties, and ties to even among normals.
  EXPECT_EQ(dst::round_to_f16(65504.0F), 65504.0F);
  EXPECT_EQ(dst::round_to_f16(65519.0F), 65504.0F);
  EXPECT_EQ(dst::round_to_f16(65520.0F), HUGE_VALF);
  EXPECT_EQ(dst::round_to_f16(-70000.0F), -HUGE_VALF);
  EXPECT_EQ(dst::round_to_f16(0x1p-24F), 0x1p-24F);
  EXPECT_EQ(dst::round_to_f16(0x1p-25F), 0.0F);
  EXPECT_EQ(dst::round_to_f16(3 * 0x1p-25F), 2 * 0x1p-24F);
  EXPECT_EQ(dst::round_to_f16(5 * 0x1p-25F), 2 * 0x1p-24F);
  EXPECT_EQ(dst::round_to_f16(1.0F + 0x1p-11F), 1.0F);
  EXPECT_EQ(dst::round_to_f16(1.0F + 3 * 0x1p-11F), 1.0F + 0x1p-9F);
  EXPECT_TRUE(std::isnan(dst::round_to_f16(std::numeric_limits<float>::quiet_NaN())));
  // bfloat16: float's exponent range, 8 significant bits.
  EXPECT_EQ(dst::round_to_bf16(65520.0F), 65536.0F);
  EXPECT_EQ(dst::round_to_bf16(1.0F + 0x1p-8F), 1.0F);
  EXPECT_EQ(dst::round_to_bf16(1.0F + 3 * 0x1p-8F), 1.0F + 0x1p-6F);
  EXPECT_EQ(dst::round_to_bf16(float_of(0x7f7f8000U)), HUGE_VALF);  // above max bf16: inf
  EXPECT_EQ(dst::round_to_bf16(float_of(0x00010000U)), float_of(0x00010000U));
}
}  // namespace
