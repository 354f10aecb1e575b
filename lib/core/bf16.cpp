/// \file bf16.cpp
/// Bit-exact float <-> bfloat16 / IEEE binary16 conversions, integer arithmetic only, so
/// they raise no floating-point exceptions (not even for signalling NaNs) and give the
/// same bits on every compiler and back end.
#include "core/bf16.hpp"

#include <cstring>

namespace dst {

namespace detail {
namespace {

std::uint32_t float_bits(float f) {
  std::uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float bits_float(std::uint32_t u) {
  float f = 0.0F;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// binary32 field masks.
constexpr std::uint32_t kF32AbsMask = 0x7fffffffU;
constexpr std::uint32_t kF32Inf = 0x7f800000U;
constexpr std::uint32_t kF32Quiet = 0x00400000U;

// bfloat16 is the upper half of a binary32; its quiet bit is the float's, shifted.
constexpr std::uint16_t kBf16Quiet = 0x0040U;

// binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
constexpr std::uint16_t kF16Inf = 0x7c00U;
constexpr std::uint16_t kF16Quiet = 0x0200U;
constexpr int kF16MantBits = 10;
constexpr int kMantShift = 23 - kF16MantBits;  // float mantissa bits dropped (13)
constexpr int kBiasDiff = 127 - 15;            // float bias - half bias
// |f| >= 65520 = 65504 (the largest half) + half an ulp (16) rounds to infinity: the tie
// goes to the even neighbour, which is 2^16 = inf because 65504's mantissa is odd.
constexpr std::uint32_t kF16OverflowF32 = 0x477ff000U;   // 65520.0f
constexpr std::uint32_t kF16MinNormalF32 = 0x38800000U;  // 2^-14
// Below 2^-25 (half the smallest subnormal, 2^-24) everything rounds to zero; the
// float exponent field of 2^-25 is 102.
constexpr std::uint32_t kF16UnderflowExp = 102;

}  // namespace
}  // namespace detail

bf16 bf16::from_float(float f) {
  using namespace detail;
  const std::uint32_t u = float_bits(f);
  if ((u & kF32AbsMask) > kF32Inf) {
    // NaN: keep sign and the top payload bits, force the quiet bit so a payload that lived
    // only in the dropped low bits cannot turn into infinity.
    return bf16{static_cast<std::uint16_t>((u >> 16) | kBf16Quiet)};
  }
  // Round to nearest, ties to even: add 0x7fff, plus 1 when the kept lsb is odd; a carry
  // out of the mantissa correctly bumps the exponent (and overflows to inf).
  const std::uint32_t rounded = u + 0x7fffU + ((u >> 16) & 1U);
  return bf16{static_cast<std::uint16_t>(rounded >> 16)};
}

float bf16::to_float() const {
  std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
  // Signalling NaNs come back quiet so that using the float cannot raise FE_INVALID.
  if ((u & detail::kF32AbsMask) > detail::kF32Inf) u |= detail::kF32Quiet;
  return detail::bits_float(u);
}

f16 f16::from_float(float f) {
  using namespace detail;
  const std::uint32_t u = float_bits(f);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000U);
  std::uint32_t a = u & kF32AbsMask;

  if (a > kF32Inf) {  // NaN: quiet, top 10 payload bits kept
    return f16{
        static_cast<std::uint16_t>(sign | kF16Inf | kF16Quiet | ((a >> kMantShift) & 0x3ffU))};
  }
  if (a >= kF16OverflowF32) return f16{static_cast<std::uint16_t>(sign | kF16Inf)};
  if (a >= kF16MinNormalF32) {
    // Normal half: rebias the exponent, then round the 13 dropped bits to nearest even;
    // a mantissa carry moves into the exponent, and cannot reach inf below 65520.
    const std::uint32_t odd = (a >> kMantShift) & 1U;
    a = a - (static_cast<std::uint32_t>(kBiasDiff) << 23) + 0xfffU + odd;
    return f16{static_cast<std::uint16_t>(sign | (a >> kMantShift))};
  }
  // Subnormal half (or zero): value = q * 2^-24 with q = m * 2^(e - 126), where m is the
  // float's 24-bit significand and e its biased exponent field.
  const std::uint32_t e = a >> 23;
  if (e < kF16UnderflowExp) return f16{sign};
  const std::uint32_t m = (a & 0x7fffffU) | 0x800000U;
  const std::uint32_t shift = 126U - e;  // 14..24
  std::uint32_t q = m >> shift;
  const std::uint32_t rem = m & ((1U << shift) - 1U);
  const std::uint32_t half = 1U << (shift - 1U);
  if (rem > half || (rem == half && (q & 1U) != 0U)) ++q;  // may become 0x400, the min normal
  return f16{static_cast<std::uint16_t>(sign | q)};
}

float f16::to_float() const {
  using namespace detail;
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000U) << 16;
  const std::uint32_t exp = (bits >> kF16MantBits) & 0x1fU;
  const std::uint32_t mant = bits & 0x3ffU;
  if (exp == 0x1fU) {  // inf, or NaN returned quiet
    return bits_float(sign | kF32Inf | (mant << kMantShift) | (mant != 0 ? kF32Quiet : 0U));
  }
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in float
    const float v = static_cast<float>(mant) * 0x1p-24F;
    return sign != 0 ? -v : v;
  }
  return bits_float(sign | ((exp + kBiasDiff) << 23) | (mant << kMantShift));
}

float round_to_bf16(float x) {
  return bf16::from_float(x).to_float();
}

float round_to_f16(float x) {
  return f16::from_float(x).to_float();
}

}  // namespace dst
