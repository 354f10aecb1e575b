// RMSNorm: out = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps), one row per work item.
#include <type_traits>

#include "kernels/kokkos/detail/common.hpp"
#include "kernels/kokkos/kokkos_backend.hpp"

namespace dst::kernels::kokkos_backend {
namespace detail {
namespace {

/// The mean of squares is accumulated in double (lane_sum) and rstd computed in double,
/// then rounded once to float: rstd is then correctly rounded up to the ~C * 2^-53 error of
/// the sum, and the backward reuses exactly the value the forward applied.
template <class T, class ExecSpace>
void rmsnorm_forward(const ExecSpace& space, const Matrix<ExecSpace, const T>& x,  // (N, C)
                     const Vector<ExecSpace, const T>& w,                          // (C)
                     const float eps, const Matrix<ExecSpace, T>& out,             // (N, C)
                     const Vector<ExecSpace, float>& rstd) {                       // (N)
  const Index c = static_cast<Index>(x.extent(1));
  Kokkos::parallel_for(
      "dst::kernels::rmsnorm_forward::rows",
      Range<ExecSpace>(space, 0, static_cast<Index>(x.extent(0))), KOKKOS_LAMBDA(const Index n) {
        const T* xr = &x(n, 0);
        const T* wr = &w(0);
        T* yr = &out(n, 0);
        const double ss = lane_sum(c, [&](const Index j) {
          const double v = to_float(xr[j]);
          return v * v;
        });
        const float r = static_cast<float>(1.0 / math::sqrt(ss / static_cast<double>(c) + eps));
        rstd(n) = r;
        for (Index j = 0; j < c; ++j)
          yr[j] = from_float<T>(to_float(xr[j]) * r * to_float(wr[j]));
      });
}

/// Widest rows whose weight-gradient sums fit on the stack of the one-pass host version
/// (32 KiB of doubles): d_model up to 4096 (DeepSeek-LLM 7B); wider rows take two passes.
constexpr Index kOnePassColumns = 4096;

/// Row n of dx += rstd * (g - xhat * mean(g * xhat)), g = dout * w, xhat = x * rstd; the
/// mean in double, in lane_sum's order. `term(j, t)` is given each t = dout * xhat of the
/// row, the weight gradient's terms, as the column pass below computes them.
template <class T, class ExecSpace, class Term>
KOKKOS_INLINE_FUNCTION void backward_row(const Matrix<ExecSpace, const T>& dout,
                                         const Matrix<ExecSpace, const T>& x,
                                         const Vector<ExecSpace, const T>& w,
                                         const Vector<ExecSpace, const float>& rstd,
                                         const Matrix<ExecSpace, T>& dx, const Index n,
                                         const Index c, const Term& term) {
  const T* gr = &dout(n, 0);
  const T* xr = &x(n, 0);
  const T* wr = &w(0);
  T* dxr = &dx(n, 0);
  const float r = rstd(n);
  const double dot = lane_sum(
      c, [&](const Index j) { return to_float(gr[j]) * to_float(wr[j]) * (to_float(xr[j]) * r); });
  const float m = static_cast<float>(dot / static_cast<double>(c));
  for (Index j = 0; j < c; ++j) {
    const float xhat = to_float(xr[j]) * r;
    dxr[j] = from_float<T>(to_float(dxr[j]) + r * (to_float(gr[j]) * to_float(wr[j]) - xhat * m));
    term(j, to_float(gr[j]) * xhat);
  }
}

/// dx += rstd * (g - xhat * mean(g * xhat)) with g = dout * w, xhat = x * rstd (row-
/// parallel); dw += sum_n dout * xhat (column-parallel, rows in order: deterministic).
template <class T, class ExecSpace>
void rmsnorm_backward(const ExecSpace& space, const Matrix<ExecSpace, const T>& dout,  // (N, C)
                      const Matrix<ExecSpace, const T>& x,                             // (N, C)
                      const Vector<ExecSpace, const T>& w,                             // (C)
                      const Vector<ExecSpace, const float>& rstd,                      // (N)
                      const Matrix<ExecSpace, T>& dx,                                  // (N, C)
                      const Vector<ExecSpace, T>& dw) {                                // (C)
  const Index n_rows = static_cast<Index>(x.extent(0));
  const Index c = static_cast<Index>(x.extent(1));
#ifdef KOKKOS_ENABLE_SERIAL
  // On one host thread both parts in one pass over the rows: each row's dout and x are
  // read from memory once, not again by the column pass below. Every column still sums
  // its rows 0..N-1 in order in double, term for term as below: the same bits.
  if constexpr (std::is_same_v<ExecSpace, Kokkos::Serial>) {
    if (c <= kOnePassColumns) {
      Kokkos::parallel_for(
          "dst::kernels::rmsnorm_backward::dx_and_dw", Range<ExecSpace>(space, 0, 1),
          KOKKOS_LAMBDA(const Index) {
            double acc[kOnePassColumns];  // (C) the weight gradient's column sums
            for (Index j = 0; j < c; ++j)
              acc[j] = 0.0;
            for (Index n = 0; n < n_rows; ++n)
              backward_row<T, ExecSpace>(
                  dout, x, w, rstd, dx, n, c,
                  [&](const Index j, const float t) { acc[j] += static_cast<double>(t); });
            T* dwr = &dw(0);
            for (Index j = 0; j < c; ++j)
              dwr[j] = from_float<T>(to_float(dwr[j]) + static_cast<float>(acc[j]));
          });
      return;
    }
  }
#endif
  Kokkos::parallel_for(
      "dst::kernels::rmsnorm_backward::dx", Range<ExecSpace>(space, 0, n_rows),
      KOKKOS_LAMBDA(const Index n) {
        backward_row<T, ExecSpace>(dout, x, w, rstd, dx, n, c, [](const Index, const float) {});
      });

  constexpr Index kBlock = column_block<ExecSpace>();
  const Index blocks = (c + kBlock - 1) / kBlock;
  Kokkos::parallel_for(
      "dst::kernels::rmsnorm_backward::dw", Range<ExecSpace>(space, 0, blocks),
      KOKKOS_LAMBDA(const Index blk) {
        const Index j0 = blk * kBlock;
        const Index width = c - j0 < kBlock ? c - j0 : kBlock;
        // Double per column: the sum runs over all N = B*T tokens of the micro-batch.
        double acc[kBlock];
        for (Index j = 0; j < kBlock; ++j)
          acc[j] = 0.0;
        for (Index n = 0; n < n_rows; ++n) {
          const T* gr = &dout(n, j0);
          const T* xr = &x(n, j0);
          const float r = rstd(n);
          for (Index j = 0; j < width; ++j)
            acc[j] += static_cast<double>(to_float(gr[j]) * (to_float(xr[j]) * r));
        }
        T* dwr = &dw(j0);
        for (Index j = 0; j < width; ++j)
          dwr[j] = from_float<T>(to_float(dwr[j]) + static_cast<float>(acc[j]));
      });
}

}  // namespace
}  // namespace detail

using Space = Kokkos::DefaultExecutionSpace;

void run(const kernels::detail::RmsnormForwardArgs& a) {
  using namespace detail;
  rmsnorm_forward<float>(Space(), Matrix<Space, const float>(a.x, a.n, a.c),
                         Vector<Space, const float>(a.w, a.c), a.eps,
                         Matrix<Space, float>(a.out, a.n, a.c), Vector<Space, float>(a.rstd, a.n));
}

void run(const kernels::detail::RmsnormBackwardArgs& a) {
  using namespace detail;
  rmsnorm_backward<float>(Space(), Matrix<Space, const float>(a.dout, a.n, a.c),
                          Matrix<Space, const float>(a.x, a.n, a.c),
                          Vector<Space, const float>(a.w, a.c),
                          Vector<Space, const float>(a.rstd, a.n),
                          Matrix<Space, float>(a.dx, a.n, a.c), Vector<Space, float>(a.dw, a.c));
}

}  // namespace dst::kernels::kokkos_backend
