// RMSNorm: out = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps), one row per work item.
#include "kernels/kokkos/detail/common.hpp"
#include "kernels/kokkos/kokkos_backend.hpp"

namespace dst::kernels::kokkos_backend {
namespace detail {
namespace {

/// The mean of squares is accumulated in double (lane_sum) and rstd computed in double,
/// then rounded once to float: rstd is then correctly rounded up to the ~C * 2^-53 error of
/// the sum, and the backward reuses exactly the value the forward applied.
template <class ExecSpace>
void rmsnorm_forward(const ExecSpace& space, const Matrix<ExecSpace, const float>& x,  // (N, C)
                     const Vector<ExecSpace, const float>& w,                          // (C)
                     const float eps, const Matrix<ExecSpace, float>& out,             // (N, C)
                     const Vector<ExecSpace, float>& rstd) {                           // (N)
  const Index c = static_cast<Index>(x.extent(1));
  Kokkos::parallel_for(
      "dst::kernels::rmsnorm_forward::rows",
      Range<ExecSpace>(space, 0, static_cast<Index>(x.extent(0))), KOKKOS_LAMBDA(const Index n) {
        const float* xr = &x(n, 0);
        const float* wr = &w(0);
        float* yr = &out(n, 0);
        const double ss = lane_sum(c, [&](const Index j) {
          const double v = xr[j];
          return v * v;
        });
        const float r = static_cast<float>(1.0 / math::sqrt(ss / static_cast<double>(c) + eps));
        rstd(n) = r;
        for (Index j = 0; j < c; ++j)
          yr[j] = xr[j] * r * wr[j];
      });
}

/// dx += rstd * (g - xhat * mean(g * xhat)) with g = dout * w, xhat = x * rstd (row-
/// parallel); dw += sum_n dout * xhat (column-parallel, rows in order: deterministic).
template <class ExecSpace>
void rmsnorm_backward(const ExecSpace& space, const Matrix<ExecSpace, const float>& dout,  // (N, C)
                      const Matrix<ExecSpace, const float>& x,                             // (N, C)
                      const Vector<ExecSpace, const float>& w,                             // (C)
                      const Vector<ExecSpace, const float>& rstd,                          // (N)
                      const Matrix<ExecSpace, float>& dx,                                  // (N, C)
                      const Vector<ExecSpace, float>& dw) {                                // (C)
  const Index n_rows = static_cast<Index>(x.extent(0));
  const Index c = static_cast<Index>(x.extent(1));
  Kokkos::parallel_for(
      "dst::kernels::rmsnorm_backward::dx", Range<ExecSpace>(space, 0, n_rows),
      KOKKOS_LAMBDA(const Index n) {
        const float* gr = &dout(n, 0);
        const float* xr = &x(n, 0);
        const float* wr = &w(0);
        float* dxr = &dx(n, 0);
        const float r = rstd(n);
        const double dot = lane_sum(c, [&](const Index j) { return gr[j] * wr[j] * (xr[j] * r); });
        const float m = static_cast<float>(dot / static_cast<double>(c));
        for (Index j = 0; j < c; ++j)
          dxr[j] += r * (gr[j] * wr[j] - (xr[j] * r) * m);
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
          const float* gr = &dout(n, j0);
          const float* xr = &x(n, j0);
          const float r = rstd(n);
          for (Index j = 0; j < width; ++j)
            acc[j] += static_cast<double>(gr[j] * (xr[j] * r));
        }
        float* dwr = &dw(j0);
        for (Index j = 0; j < width; ++j)
          dwr[j] += static_cast<float>(acc[j]);
      });
}

}  // namespace
}  // namespace detail

using Space = Kokkos::DefaultExecutionSpace;

void run(const kernels::detail::RmsnormForwardArgs& a) {
  using namespace detail;
  rmsnorm_forward(Space(), Matrix<Space, const float>(a.x, a.n, a.c),
                  Vector<Space, const float>(a.w, a.c), a.eps,
                  Matrix<Space, float>(a.out, a.n, a.c), Vector<Space, float>(a.rstd, a.n));
}

void run(const kernels::detail::RmsnormBackwardArgs& a) {
  using namespace detail;
  rmsnorm_backward(Space(), Matrix<Space, const float>(a.dout, a.n, a.c),
                   Matrix<Space, const float>(a.x, a.n, a.c), Vector<Space, const float>(a.w, a.c),
                   Vector<Space, const float>(a.rstd, a.n), Matrix<Space, float>(a.dx, a.n, a.c),
                   Vector<Space, float>(a.dw, a.c));
}

}  // namespace dst::kernels::kokkos_backend
