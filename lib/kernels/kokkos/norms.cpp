// Gradient clipping's kernels: the sum of squares (the norm), the non-finite search, and
// the in-place scale.
#include <cstdint>
#include <cstring>
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

template <class ExecSpace>
double sum_of_squares(const ExecSpace& space, const Vector<ExecSpace, const float>& x) {  // (n)
  const Index n = static_cast<Index>(x.extent(0));
  const Index chunks = (n + kSquaresChunk - 1) / kSquaresChunk;
  double total = 0.0;
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
      Kokkos::Sum<double>(total));
  return total;
}

/// NaN and Inf are the floats whose exponent bits are all ones. Testing the bits (not
/// x != x or isfinite) raises no floating-point exception, so the search runs under the
/// tests' FE_INVALID trap and on signalling NaNs.
KOKKOS_INLINE_FUNCTION bool nonfinite_bits(const float x) {
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return (bits & 0x7f800000u) == 0x7f800000u;
}

template <class ExecSpace>
Index first_nonfinite(const ExecSpace& space, const Vector<ExecSpace, const float>& x) {  // (n)
  Index first = std::numeric_limits<Index>::max();
  Kokkos::parallel_reduce(
      "dst::kernels::first_nonfinite::elements",
      Range<ExecSpace>(space, 0, static_cast<Index>(x.extent(0))),
      KOKKOS_LAMBDA(const Index i, Index& lmin) {
        if (nonfinite_bits(x(i)) && i < lmin) lmin = i;
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
  *a.result = sum_of_squares(Space(), Vector<Space, const float>(a.x, a.n));
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
