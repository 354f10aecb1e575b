// Gradient clipping's kernels: the sum of squares (the norm), the non-finite search, and
// the in-place scale.
#include <cstdint>
#include <limits>

#include "kernels/kokkos/detail/common.hpp"
#include "kernels/kokkos/kokkos_backend.hpp"

namespace dst::kernels::kokkos_backend {
namespace detail {
namespace {

/// Consecutive elements one work item sums (in lane_sum's fixed order). The chunk, not the
/// thread, is the unit of the sum, so the partial sums are the same whatever runs them;
/// 8192 floats (32 KiB) make the work item long enough that the reduction's overhead does
/// not show, and still give 10^4+ items for the large matrices (a 4096 x 102400 lm_head).
constexpr Index kSquaresChunk = 8192;

/// Into `result`: a host double (parallel_reduce waits for it) or a rank-0 view in the
/// space's memory (it does not); the same reduction, so the same bits, either way.
template <class ExecSpace, class Result>
void sum_of_squares(const ExecSpace& space, const Vector<ExecSpace, const float>& x,  // (n)
                    Result&& result) {
  const Index n = static_cast<Index>(x.extent(0));
  const Index chunks = (n + kSquaresChunk - 1) / kSquaresChunk;
  Kokkos::parallel_reduce(
      "dst::kernels::sum_of_squares::chunks", Range<ExecSpace>(space, 0, chunks),
      KOKKOS_LAMBDA(const Index chunk, double& acc) {
        const Index j0 = chunk * kSquaresChunk;
        const Index len = n - j0 < kSquaresChunk ? n - j0 : kSquaresChunk;
        const float* xc = &x(j0);
        // A float's square is exact in double (24 + 24 < 53 bits): only the sum rounds.
        acc += lane_sum(len, [&](const Index j) {
          const double v = xc[j];
          return v * v;
        });
      },
      result);
}

using ::dst::kernels::detail::fast_math::float_bits;
using ::dst::kernels::detail::fast_math::nonfinite_bits;

/// Consecutive elements one work item of the non-finite search scans (16 KiB).
constexpr Index kScanChunk = 4096;

/// Two passes per chunk: a branch-free unsigned max of the exponent bits, which
/// vectorises (a per-element `if` in the min reduction did not: 2.6 GB/s against 6-13 for
/// the sum of squares, kernels_benchmark BM_first_nonfinite), then, only in a chunk whose
/// max has every exponent bit set, the exact first position. A min over chunks, so the
/// answer is the first position whatever order the chunks run in.
template <class ExecSpace>
Index first_nonfinite(const ExecSpace& space, const Vector<ExecSpace, const float>& x) {  // (n)
  const Index n = static_cast<Index>(x.extent(0));
  const Index chunks = (n + kScanChunk - 1) / kScanChunk;
  Index first = std::numeric_limits<Index>::max();
  Kokkos::parallel_reduce(
      "dst::kernels::first_nonfinite::chunks", Range<ExecSpace>(space, 0, chunks),
      KOKKOS_LAMBDA(const Index chunk, Index& lmin) {
        const Index j0 = chunk * kScanChunk;
        const Index len = n - j0 < kScanChunk ? n - j0 : kScanChunk;
        const float* xc = &x(j0);
        std::uint32_t exponents = 0;
        for (Index j = 0; j < len; ++j) {
          const std::uint32_t e = float_bits(xc[j]) & 0x7f800000u;
          exponents = e > exponents ? e : exponents;
        }
        if (exponents != 0x7f800000u) return;
        for (Index j = 0; j < len; ++j)
          if (nonfinite_bits(xc[j])) {
            if (j0 + j < lmin) lmin = j0 + j;
            return;
          }
      },
      Kokkos::Min<Index>(first));
  return first == std::numeric_limits<Index>::max() ? -1 : first;
}

template <class ExecSpace>
void scale(const ExecSpace& space, const Vector<ExecSpace, float>& x, const float factor) {  // (n)
  Kokkos::parallel_for(
      "dst::kernels::scale::elements", Range<ExecSpace>(space, 0, static_cast<Index>(x.extent(0))),
      KOKKOS_LAMBDA(const Index i) { x(i) *= factor; });
}

}  // namespace
}  // namespace detail

using Space = Kokkos::DefaultExecutionSpace;

void run(const kernels::detail::SumOfSquaresArgs& a) {
  using namespace detail;
  // parallel_reduce into a host scalar waits for the result: no separate fence.
  double total = 0.0;
  sum_of_squares(Space(), Vector<Space, const float>(a.x, a.n), total);
  *a.result = total;
}

void run(const kernels::detail::SumOfSquaresIntoArgs& a) {
  using namespace detail;
  Kokkos::View<double, Space::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>> out(a.out);
  sum_of_squares(Space(), Vector<Space, const float>(a.x, a.n), out);
  // A reduction into a view may return before the value is there; in memory the host reads
  // directly, make it be there (a device space stays asynchronous: the caller's copy waits).
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, Space::memory_space>::accessible)
    Space().fence();
}

void run(const kernels::detail::FirstNonfiniteArgs& a) {
  using namespace detail;
  *a.result = first_nonfinite(Space(), Vector<Space, const float>(a.x, a.n));
}

void run(const kernels::detail::FirstNonfiniteMinArgs& a) {
  using namespace detail;
  const Index at = first_nonfinite(Space(), Vector<Space, const float>(a.x, a.n));
  if (at < 0) return;
  // The flag lives in the back end's memory space: lowered by one work item there.
  const std::uint64_t found = a.offset + static_cast<std::uint64_t>(at);
  std::uint64_t* flag = a.flag;
  Kokkos::parallel_for(
      "dst::kernels::first_nonfinite_min", Kokkos::RangePolicy<Space>(0, 1),
      KOKKOS_LAMBDA(const int) {
        if (found < *flag) *flag = found;
      });
  Space().fence();
}

void run(const kernels::detail::ScaleArgs& a) {
  using namespace detail;
  scale(Space(), Vector<Space, float>(a.x, a.n), a.factor);
}

}  // namespace dst::kernels::kokkos_backend
