// Elementwise kernels: the residual add, gradient accumulation, zero fill, and the
// rounding that emulates 16-bit storage.
#include <cstdint>

#include "core/bf16.hpp"

#include "kernels/kokkos/detail/common.hpp"
#include "kernels/kokkos/kokkos_backend.hpp"

namespace dst::kernels::kokkos_backend {
namespace detail {
namespace {

/// out may alias a or b: element i reads a(i), b(i) and then writes out(i).
template <class T, class ExecSpace>
void add(const ExecSpace& space, const Vector<ExecSpace, const T>& a,
         const Vector<ExecSpace, const T>& b, const Vector<ExecSpace, T>& out) {
  Kokkos::parallel_for(
      "dst::kernels::add::elements", Range<ExecSpace>(space, 0, static_cast<Index>(out.extent(0))),
      KOKKOS_LAMBDA(const Index i) { out(i) = from_float<T>(to_float(a(i)) + to_float(b(i))); });
}

template <class T, class ExecSpace>
void accumulate(const ExecSpace& space, const Vector<ExecSpace, const T>& x,
                const Vector<ExecSpace, T>& y) {
  Kokkos::parallel_for(
      "dst::kernels::accumulate::elements",
      Range<ExecSpace>(space, 0, static_cast<Index>(y.extent(0))),
      KOKKOS_LAMBDA(const Index i) { y(i) = from_float<T>(to_float(y(i)) + to_float(x(i))); });
}

/// Zero bits are zero in every dtype here (IEEE +0, integers, bf16/f16), so the fill is by
/// element width, not by dtype.
template <class ExecSpace, class Word>
void zero(const ExecSpace& space, const Vector<ExecSpace, Word>& t) {
  Kokkos::parallel_for(
      "dst::kernels::zero::elements", Range<ExecSpace>(space, 0, static_cast<Index>(t.extent(0))),
      KOKKOS_LAMBDA(const Index i) { t(i) = Word(0); });
}

/// x(i) = x(i) stored in 16 bits and read back (core/bf16.hpp's conversions, integer
/// arithmetic: no floating-point exception, the same bits on every back end). Those
/// conversions are host functions: a Kokkos device back end needs them marked
/// KOKKOS_INLINE_FUNCTION first (common.hpp, "Adding bf16 storage").
template <class ExecSpace>
void round_to_storage(const ExecSpace& space, const Vector<ExecSpace, float>& x, const bool f16) {
  const Index n = static_cast<Index>(x.extent(0));
  if (f16)
    Kokkos::parallel_for(
        "dst::kernels::round_to_storage::f16", Range<ExecSpace>(space, 0, n),
        KOKKOS_LAMBDA(const Index i) { x(i) = dst::round_to_f16(x(i)); });
  else
    Kokkos::parallel_for(
        "dst::kernels::round_to_storage::bf16", Range<ExecSpace>(space, 0, n),
        KOKKOS_LAMBDA(const Index i) { x(i) = dst::round_to_bf16(x(i)); });
}

}  // namespace
}  // namespace detail

using Space = Kokkos::DefaultExecutionSpace;

void run(const kernels::detail::AddArgs& a) {
  using namespace detail;
  add<float>(Space(), Vector<Space, const float>(a.a, a.n), Vector<Space, const float>(a.b, a.n),
             Vector<Space, float>(a.out, a.n));
}

void run(const kernels::detail::AccumulateArgs& a) {
  using namespace detail;
  accumulate<float>(Space(), Vector<Space, const float>(a.x, a.n), Vector<Space, float>(a.y, a.n));
}

void run(const kernels::detail::ZeroArgs& a) {
  using namespace detail;
  const auto n = static_cast<Index>(a.bytes / a.element_size);
  switch (a.element_size) {
    case 8:
      zero(Space(), Vector<Space, std::uint64_t>(static_cast<std::uint64_t*>(a.data), n));
      return;
    case 4:
      zero(Space(), Vector<Space, std::uint32_t>(static_cast<std::uint32_t*>(a.data), n));
      return;
    case 2:
      zero(Space(), Vector<Space, std::uint16_t>(static_cast<std::uint16_t*>(a.data), n));
      return;
    default:
      zero(Space(), Vector<Space, std::uint8_t>(static_cast<std::uint8_t*>(a.data),
                                                static_cast<Index>(a.bytes)));
      return;
  }
}

void run(const kernels::detail::RoundToStorageArgs& a) {
  using namespace detail;
  round_to_storage(Space(), Vector<Space, float>(a.x, a.n), a.f16);
}

}  // namespace dst::kernels::kokkos_backend
