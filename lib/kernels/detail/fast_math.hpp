#pragma once
/// \file fast_math.hpp
/// The scalar math both kernel back ends share, one definition for the Kokkos kernels
/// (kokkos/detail/common.hpp) and the native CUDA ones (cuda/detail/math.cuh), so that
/// they compute the same bits by construction: the branch-free exp, the overflow-free
/// sigmoid and the non-finite test on the bits. Host and device functions wherever a
/// device compiler includes this header (nvcc for the CUDA back end and for a Kokkos CUDA
/// build, hipcc for Kokkos HIP), plain inline functions otherwise. On a device the bits
/// are the host's because dstrain's code is compiled without multiply-add contraction
/// (-ffp-contract=off, -fmad=false; lib/kernels/CMakeLists.txt) and with IEEE division,
/// square root and subnormals (nvcc's defaults). Internal to kernels/.

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define DST_KERNEL_HD __host__ __device__ __forceinline__
#else
#define DST_KERNEL_HD inline
#endif

namespace dst::kernels::detail::fast_math {

/// The bits of a float and back (memcpy: no aliasing question; one register move).
DST_KERNEL_HD std::uint32_t float_bits(const float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  std::uint32_t u = 0;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

DST_KERNEL_HD float bits_float(const std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f = 0.0f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

/// fabs on the bits: clears the sign; NaN stays NaN.
DST_KERNEL_HD float abs_bits(const float x) {
  return bits_float(float_bits(x) & 0x7fffffffu);
}

/// NaN and Inf are the floats whose exponent bits are all ones. Testing the bits (not
/// x != x or isfinite) raises no floating-point exception, so the search runs under the
/// tests' FE_INVALID trap and on signalling NaNs.
DST_KERNEL_HD bool nonfinite_bits(const float x) {
  return (float_bits(x) & 0x7f800000u) == 0x7f800000u;
}

/// exp(x) for float x, branch-free so that loops calling it vectorise (glibc's expf is a
/// scalar call: without it the softmax, cross-entropy and SwiGLU kernels spent ~4 ns per
/// element in exp alone). Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, then Cephes'
/// degree-6 polynomial for exp(r) (Moshier, Cephes Math Library, expf.c) and a scale by
/// 2^n built in the exponent bits. Error <= 1 ulp over the whole range (0.92 measured;
/// kernels_tests FastExp checks 2 ulp against double exp). x < ln(FLT_MIN) gives 0 (the
/// true value is not a normal float: flushed, error < 1.2e-38), x > ln(FLT_MAX) +inf.
DST_KERNEL_HD float fast_exp(const float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;  // exact in 9 bits: n * kLn2Hi is exact
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  constexpr float kMin = -87.33654f;     // ln(FLT_MIN): below, the result is not normal
  constexpr float kMax = 88.72283f;      // ln(FLT_MAX), rounded down
  // Every comparison and product below is evaluated unconditionally, each select has one
  // comparison: with the default -ftrapping-math a compiler may not speculate a
  // conditional one, and a loop with a branch does not vectorise.
  const float xl = x < kMin ? kMin : x;
  const float xc = xl > kMax ? kMax : xl;
  // n = round(xc / ln2) in float arithmetic: exact for |n| < 2^22 in the default mode.
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
  // 2^n: n + 127 in the exponent field. The low bits of t hold n + 0x400000 (the
  // mantissa of 1.5 * 2^23 + n); n in [-126, 128] after the clamp. 2^n is formed as two
  // halves so that n = 128 (x near the top of the range) still yields a finite factor.
  // n1 + 127 and n - n1 + 127 are positive: the shifts are of unsigned values.
  const std::int32_t ni = static_cast<std::int32_t>(float_bits(t)) - 0x4B400000;
  const std::int32_t n1 = ni >> 1;
  const float s1 = bits_float(static_cast<std::uint32_t>(n1 + 127) << 23);
  const float s2 = bits_float(static_cast<std::uint32_t>(ni - n1 + 127) << 23);
  const float y = p * s1 * s2;  // NaN in x stays NaN through the clamp and the arithmetic
  const float y_lo = x < kMin ? 0.0f : y;
  return x > kMax ? bits_float(0x7f800000u) : y_lo;  // +inf
}

/// Logistic sigmoid without overflow: exp is only ever taken of -|x| <= 0, so no inf
/// appears for large |x| (1 / (1 + exp(-x)) overflows exp for x < -88).
DST_KERNEL_HD float sigmoid(const float x) {
  const float e = fast_exp(-abs_bits(x));
  const float inv = 1.0f / (1.0f + e);
  const float e_inv = e * inv;  // unconditional: see fast_exp
  return x >= 0.0f ? inv : e_inv;
}

}  // namespace dst::kernels::detail::fast_math
