#pragma once
/// \file math.cuh
/// Scalar math of the CUDA back end that must give the same bits as the Kokkos back end:
/// the branch-free exp, the sigmoid and the non-finite test (shared with it:
/// kernels/detail/fast_math.hpp), and the bf16 / f16 rounding of core/bf16.cpp, ported
/// operation for operation. Host and device functions (plain inline functions when a C++
/// compiler includes this header), so a host test can check every port bitwise against
/// its original; on the device the same bits follow because the back end is compiled
/// without FMA contraction (-fmad=false, lib/kernels/CMakeLists.txt) and with IEEE
/// division, square root and subnormals (nvcc's defaults). Internal to kernels/cuda/.

#include <cstdint>
#include <cstring>

#include "kernels/detail/fast_math.hpp"

#if defined(__CUDACC__)
#define DST_CUDA_HD __host__ __device__ __forceinline__
#else
#define DST_CUDA_HD inline
#endif

namespace dst::kernels::cuda_backend::detail::math {

// The exp, sigmoid and non-finite test are the Kokkos back end's own definitions
// (kernels/detail/fast_math.hpp), shared rather than ported.
using ::dst::kernels::detail::fast_math::abs_bits;
using ::dst::kernels::detail::fast_math::bits_float;
using ::dst::kernels::detail::fast_math::fast_exp;
using ::dst::kernels::detail::fast_math::float_bits;
using ::dst::kernels::detail::fast_math::nonfinite_bits;
using ::dst::kernels::detail::fast_math::sigmoid;

DST_CUDA_HD float negative_infinity() {
  return bits_float(0xff800000u);
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
