#pragma once
/// \file math.cuh
/// Scalar math of the CUDA back end that must give the same bits as the Kokkos back end:
/// the branch-free exp and the sigmoid of kernels/kokkos/detail/common.hpp, the
/// non-finite test of kokkos/norms.cpp, and the bf16 / f16 rounding of core/bf16.cpp,
/// operation for operation. Host and device functions (plain inline functions when a C++
/// compiler includes this header), so a host test can check every port bitwise against
/// its original; on the device the same bits follow because the back end is compiled
/// without FMA contraction (-fmad=false, lib/kernels/CMakeLists.txt) and with IEEE
/// division, square root and subnormals (nvcc's defaults). Internal to kernels/cuda/.

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define DST_CUDA_HD __host__ __device__ __forceinline__
#else
#define DST_CUDA_HD inline
#endif

namespace dst::kernels::cuda_backend::detail::math {

DST_CUDA_HD std::uint32_t float_bits(const float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  std::uint32_t u = 0;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

DST_CUDA_HD float bits_float(const std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f = 0.0f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

DST_CUDA_HD float negative_infinity() {
  return bits_float(0xff800000u);
}

DST_CUDA_HD float abs_bits(const float x) {
  return bits_float(float_bits(x) & 0x7fffffffu);  // fabs: clears the sign, NaN stays NaN
}

/// The Kokkos back end's fast_exp (Cody-Waite reduction, Cephes' degree-6 polynomial,
/// 2^n from the exponent bits; <= 1 ulp), the same float operations in the same order.
DST_CUDA_HD float fast_exp(const float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23
  constexpr float kMin = -87.33654f;     // ln(FLT_MIN)
  constexpr float kMax = 88.72283f;      // ln(FLT_MAX), rounded down
  const float xl = x < kMin ? kMin : x;
  const float xc = xl > kMax ? kMax : xl;
  const float t = xc * kLog2e + kRound;
  const float n = t - kRound;
  const float r = (xc - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const std::int32_t ni = static_cast<std::int32_t>(float_bits(t)) - 0x4B400000;
  const std::int32_t n1 = ni >> 1;
  // Shifted as unsigned (no signed-shift UB); the bits are those of Kokkos' int32 shifts.
  const float s1 = bits_float(static_cast<std::uint32_t>(n1 + 127) << 23);
  const float s2 = bits_float(static_cast<std::uint32_t>(ni - n1 + 127) << 23);
  const float y = p * s1 * s2;
  const float y_lo = x < kMin ? 0.0f : y;
  return x > kMax ? bits_float(0x7f800000u) : y_lo;
}

/// The Kokkos back end's overflow-free logistic sigmoid.
DST_CUDA_HD float sigmoid(const float x) {
  const float e = fast_exp(-abs_bits(x));
  const float inv = 1.0f / (1.0f + e);
  const float e_inv = e * inv;
  return x >= 0.0f ? inv : e_inv;
}

/// NaN or +-Inf, decided on the exponent bits (kokkos/norms.cpp).
DST_CUDA_HD bool nonfinite_bits(const float x) {
  return (float_bits(x) & 0x7f800000u) == 0x7f800000u;
}

/// core/bf16.cpp's bf16::from_float then to_float: round to nearest even on the bits;
/// NaN keeps its sign and top payload bits and comes back quiet.
DST_CUDA_HD float round_to_bf16(const float x) {
  const std::uint32_t u = float_bits(x);
  std::uint32_t b;
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    b = ((u >> 16) | 0x0040u) & 0xffffu;
  } else {
    b = ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16) & 0xffffu;
  }
  std::uint32_t back = b << 16;
  if ((back & 0x7fffffffu) > 0x7f800000u) back |= 0x00400000u;
  return bits_float(back);
}

/// core/bf16.cpp's f16::from_float (nearest even, |x| >= 65520 to inf, subnormals below
/// 2^-14, NaN quiet) then f16::to_float.
DST_CUDA_HD float round_to_f16(const float x) {
  constexpr int kMantShift = 13;                 // float mantissa bits dropped
  constexpr std::uint32_t kBiasDiff = 127 - 15;  // float bias - half bias
  const std::uint32_t u = float_bits(x);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  std::uint32_t a = u & 0x7fffffffu;
  std::uint32_t h;  // the binary16 bits
  if (a > 0x7f800000u) {
    h = sign | 0x7c00u | 0x0200u | ((a >> kMantShift) & 0x3ffu);
  } else if (a >= 0x477ff000u) {  // 65520.0f
    h = sign | 0x7c00u;
  } else if (a >= 0x38800000u) {  // 2^-14, the smallest normal half
    const std::uint32_t odd = (a >> kMantShift) & 1u;
    a = a - (kBiasDiff << 23) + 0xfffu + odd;
    h = (sign | (a >> kMantShift)) & 0xffffu;
  } else {
    const std::uint32_t e = a >> 23;
    if (e < 102) {  // below 2^-25: rounds to zero
      h = sign;
    } else {
      const std::uint32_t m = (a & 0x7fffffu) | 0x800000u;
      const std::uint32_t shift = 126u - e;  // 14..24
      std::uint32_t q = m >> shift;
      const std::uint32_t rem = m & ((1u << shift) - 1u);
      const std::uint32_t half = 1u << (shift - 1u);
      if (rem > half || (rem == half && (q & 1u) != 0u)) ++q;
      h = (sign | q) & 0xffffu;
    }
  }
  // f16::to_float
  const std::uint32_t hs = (h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  if (exp == 0x1fu)
    return bits_float(hs | 0x7f800000u | (mant << kMantShift) | (mant != 0 ? 0x00400000u : 0u));
  if (exp == 0) {
    const float v = static_cast<float>(mant) * 0x1p-24f;  // exact: mant < 2^10
    return hs != 0 ? -v : v;
  }
  return bits_float(hs | ((exp + kBiasDiff) << 23) | (mant << kMantShift));
}

}  // namespace dst::kernels::cuda_backend::detail::math
