#pragma once
/// \file common.hpp
/// What every Kokkos kernel of this back end shares: unmanaged views over the tensors'
/// memory, the row policy, math functions that compile on host and device under both
/// Kokkos 3.4 and 4.x, and the fixed-order row reductions. Internal to kernels/kokkos/.

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "core/error.hpp"

namespace dst::kernels::kokkos_backend::detail {

using Index = std::int64_t;

/// Unmanaged (non-owning) views: the Tensor owns nothing either; the memory belongs to an
/// Arena or the parameter store. LayoutRight = the tensors' row-major layout.
template <class ExecSpace, class T>
using Vector = Kokkos::View<T*, Kokkos::LayoutRight, typename ExecSpace::memory_space,
                            Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
template <class ExecSpace, class T>
using Matrix = Kokkos::View<T**, Kokkos::LayoutRight, typename ExecSpace::memory_space,
                            Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

/// One work item per row (or element); 64-bit indices because N*V passes 2^31 for real
/// vocabularies (8192 tokens x 102400 logits).
template <class ExecSpace>
using Range = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<Index>>;

/// Columns one work item owns in the column-parallel, row-sequential reductions (weight
/// gradients). On host spaces a block of 64 floats (4 cache lines) gives the inner loop
/// contiguous, vectorisable work; on devices one column per thread keeps the loads of a
/// warp coalesced. Either way each column is summed over rows 0..N-1 in order.
template <class ExecSpace>
constexpr Index column_block() {
  return Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename ExecSpace::memory_space>::accessible
             ? 64
             : 1;
}

/// Storage <-> compute conversions. The kernels of this folder are templates on the element
/// type T their activations (and the gradients and parameters they read or write) are
/// stored in; every load goes through to_float, every store through from_float<T>, and all
/// arithmetic and accumulation is in float or double whatever T is. Only T = float is
/// instantiated: both helpers are then the identity and the kernels compile to the same
/// code as when they were written against float.
///
/// Adding bf16 storage (fp32 accumulation) needs no kernel change:
///   1. here, a `dst::bf16` overload of to_float and a specialisation of from_float
///      (include "core/bf16.hpp"; e.g. `return x.to_float();` and
///      `return dst::bf16::from_float(x);`, marked KOKKOS_INLINE_FUNCTION, so the
///      conversions in lib/core/bf16.cpp must be made available to device code);
///   2. in each kernel file's `run`, instantiate the kernel templates with T = dst::bf16
///      next to the existing T = float (views over the bf16 tensors' memory);
///   3. the dtype checks in kernels.cpp then admit DType::bf16 for those tensors.
/// Tables and statistics that are not activations (rope's cos/sin, rmsnorm's rstd, the
/// per-token losses) stay float.
KOKKOS_INLINE_FUNCTION float to_float(const float x) {
  return x;
}
template <class T>
KOKKOS_INLINE_FUNCTION T from_float(float x);
template <>
KOKKOS_INLINE_FUNCTION float from_float<float>(const float x) {
  return x;
}

// Math that compiles in kernel bodies on every back end: Kokkos' functions moved from
// Kokkos::Experimental (3.4) to Kokkos (3.7, and the only place in 4.x).
#if KOKKOS_VERSION >= 30700
#define DST_KOKKOS_MATH_NS Kokkos
#else
#define DST_KOKKOS_MATH_NS Kokkos::Experimental
#endif
namespace math {
KOKKOS_INLINE_FUNCTION double log(double x) {
  return DST_KOKKOS_MATH_NS::log(x);
}
KOKKOS_INLINE_FUNCTION double sqrt(double x) {
  return DST_KOKKOS_MATH_NS::sqrt(x);
}
KOKKOS_INLINE_FUNCTION double pow(double x, double y) {
  return DST_KOKKOS_MATH_NS::pow(x, y);
}
KOKKOS_INLINE_FUNCTION double cos(double x) {
  return DST_KOKKOS_MATH_NS::cos(x);
}
KOKKOS_INLINE_FUNCTION double sin(double x) {
  return DST_KOKKOS_MATH_NS::sin(x);
}
KOKKOS_INLINE_FUNCTION float fabs(float x) {
  return DST_KOKKOS_MATH_NS::fabs(x);
}

/// exp(x) for float x, branch-free so that loops calling it vectorise (glibc's expf is a
/// scalar call: without it the softmax, cross-entropy and SwiGLU kernels spent ~4 ns per
/// element in exp alone). Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, then Cephes'
/// degree-6 polynomial for exp(r) (Moshier, Cephes Math Library, expf.c) and a scale by
/// 2^n built in the exponent bits. Error <= 1 ulp over the whole range (0.92 measured;
/// kernels_tests FastExp checks 2 ulp against double exp). x < ln(FLT_MIN) gives 0 (the
/// true value is not a normal float: flushed, error < 1.2e-38), x > ln(FLT_MAX) +inf.
KOKKOS_INLINE_FUNCTION float fast_exp(float x) {
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
  std::int32_t tb;
  std::memcpy(&tb, &t, sizeof tb);
  const std::int32_t ni = tb - 0x4B400000;
  const std::int32_t n1 = ni >> 1;
  const std::int32_t b1 = (n1 + 127) << 23;
  const std::int32_t b2 = (ni - n1 + 127) << 23;
  float s1, s2;
  std::memcpy(&s1, &b1, sizeof s1);
  std::memcpy(&s2, &b2, sizeof s2);
  const float y = p * s1 * s2;  // NaN in x stays NaN through the clamp and the arithmetic
  const float y_lo = x < kMin ? 0.0f : y;
  return x > kMax ? std::numeric_limits<float>::infinity() : y_lo;
}

/// Logistic sigmoid without overflow: exp is only ever taken of -|x| <= 0, so no inf
/// appears for large |x| (1 / (1 + exp(-x)) overflows exp for x < -88).
KOKKOS_INLINE_FUNCTION float sigmoid(float x) {
  const float e = fast_exp(-fabs(x));
  const float inv = 1.0f / (1.0f + e);
  const float e_inv = e * inv;  // unconditional: see fast_exp
  return x >= 0.0f ? inv : e_inv;
}
}  // namespace math
#undef DST_KOKKOS_MATH_NS

/// Number of interleaved partial sums of the row reductions. Without -ffast-math a
/// compiler may not reorder a floating-point sum, so one accumulator runs at the latency
/// of an add (4 cycles); eight independent chains run at its throughput and vectorise.
/// The order stays fixed (lane k sums j = k mod 8, then the lanes pairwise), so results
/// are deterministic and independent of the back end's parallelism.
inline constexpr int kLanes = 8;

/// sum_{j < n} f(j) in double, in the fixed lane order above. Double because the rows
/// are long (C, T, V up to 1e5) and the terms are squares or exponentials of one sign:
/// a float sum would lose ~n * 2^-24 relative in the worst case, 6e-3 at V = 102400.
template <class F>
KOKKOS_INLINE_FUNCTION double lane_sum(const Index n, const F& f) {
  double acc[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
  Index j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int k = 0; k < kLanes; ++k)
      acc[k] += static_cast<double>(f(j + k));
  for (int k = 0; j < n; ++j, ++k)
    acc[k] += static_cast<double>(f(j));
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/// max_{j < n} f(j) (n >= 1), in kLanes chains like lane_sum (max is exact, so only speed
/// depends on the order).
template <class F>
KOKKOS_INLINE_FUNCTION float lane_max(const Index n, const F& f) {
  float m[kLanes];
  for (int k = 0; k < kLanes; ++k)
    m[k] = -std::numeric_limits<float>::infinity();
  Index j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int k = 0; k < kLanes; ++k) {
      const float v = f(j + k);
      m[k] = v > m[k] ? v : m[k];
    }
  for (int k = 0; j < n; ++j, ++k) {
    const float v = f(j);
    m[k] = v > m[k] ? v : m[k];
  }
  float r = m[0];
  for (int k = 1; k < kLanes; ++k)
    r = m[k] > r ? m[k] : r;
  return r;
}

/// Position of the first id outside [0, v) that is not `ignore_index` (pass a value
/// outside int32 range, e.g. -1 with allow_ignore = false, to disallow ignoring), or -1.
/// Runs on the back end's space so device-resident ids are checked without a copy; the
/// reduction is a min, so the answer does not depend on the order.
template <class ExecSpace>
Index first_bad_id(const ExecSpace& space, const std::string& label,
                   const Vector<ExecSpace, const std::int32_t>& ids, const Index v,
                   const bool allow_ignore, const std::int32_t ignore_index) {
  Index first = std::numeric_limits<Index>::max();
  Kokkos::parallel_reduce(
      label, Range<ExecSpace>(space, 0, static_cast<Index>(ids.extent(0))),
      KOKKOS_LAMBDA(const Index n, Index& lmin) {
        const std::int32_t id = ids(n);
        const bool ok = (id >= 0 && id < v) || (allow_ignore && id == ignore_index);
        if (!ok && n < lmin) lmin = n;
      },
      Kokkos::Min<Index>(first));
  return first == std::numeric_limits<Index>::max() ? -1 : first;
}

/// The id at position n (one element read back from the back end's memory; error path).
template <class ExecSpace>
std::int32_t id_at(const ExecSpace& space, const std::string& label,
                   const Vector<ExecSpace, const std::int32_t>& ids, const Index n) {
  std::int64_t value = 0;
  Kokkos::parallel_reduce(
      label, Range<ExecSpace>(space, n, n + 1),
      KOKKOS_LAMBDA(const Index i, std::int64_t& s) { s += ids(i); },
      Kokkos::Sum<std::int64_t>(value));
  return static_cast<std::int32_t>(value);
}

}  // namespace dst::kernels::kokkos_backend::detail
