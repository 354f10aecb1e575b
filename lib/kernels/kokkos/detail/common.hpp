#pragma once
/// \file common.hpp
/// What every Kokkos kernel of this back end shares: unmanaged views over the tensors'
/// memory, the row policy, math functions that compile on host and device under both
/// Kokkos 3.4 and 4.x, and the fixed-order row reductions. Internal to kernels/kokkos/.

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <limits>
#include <string>

#include "core/error.hpp"
#include "kernels/detail/fast_math.hpp"

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
/// The float square root. IEEE 754 requires sqrt to be correctly rounded, so this is
/// bit for bit the double square root rounded to float (53 >= 2 * 24 + 2 bits: no
/// double-rounding error), at half the vector width's cost: 16 floats per AVX-512
/// instruction instead of 8 doubles.
KOKKOS_INLINE_FUNCTION float sqrt(float x) {
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

// The branch-free exp and the overflow-free sigmoid: one definition for both back ends
// (kernels/detail/fast_math.hpp), so the CUDA kernels compute this back end's bits.
using ::dst::kernels::detail::fast_math::fast_exp;
using ::dst::kernels::detail::fast_math::sigmoid;
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

/// An int32 whose signed order is the order of the floats (negative floats' magnitude
/// bits flipped): -inf < -x < -0 < +0 < x < +inf < NaN with the sign bit clear. An
/// involution, so it also maps a key back to its float's bits.
KOKKOS_INLINE_FUNCTION std::int32_t float_order_key(const std::int32_t bits) {
  return bits ^ ((bits >> 31) & 0x7fffffff);
}

/// max_{j < n} f(j) (n >= 1), exact. The comparison runs on float_order_key's integers:
/// a float `v > m ? v : m` does not vectorise without -ffast-math (the compiler keeps
/// its NaN and signed-zero semantics as scalar compare-and-move, a third of the causal
/// softmax's time at T = 256), an integer max does. A NaN with the sign bit clear is the
/// maximum (the rows that hold one come out NaN either way: its own exp is NaN).
template <class F>
KOKKOS_INLINE_FUNCTION float row_max(const Index n, const F& f) {
  namespace fm = ::dst::kernels::detail::fast_math;
  std::int32_t m = float_order_key(
      static_cast<std::int32_t>(fm::float_bits(-std::numeric_limits<float>::infinity())));
  for (Index j = 0; j < n; ++j) {
    const std::int32_t k = float_order_key(static_cast<std::int32_t>(fm::float_bits(f(j))));
    m = k > m ? k : m;
  }
  return fm::bits_float(static_cast<std::uint32_t>(float_order_key(m)));
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
