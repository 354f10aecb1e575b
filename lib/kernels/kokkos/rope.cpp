// Rotary position embeddings, rotate-half convention (Llama, DeepSeek-LLM): dimension i
// pairs with i + D/2 and rotates by angle(t, i) = t * theta^(-2i/D).
#include "kernels/kokkos/detail/common.hpp"
#include "kernels/kokkos/kokkos_backend.hpp"

namespace dst::kernels::kokkos_backend {
namespace detail {
namespace {

/// Angles in double, rounded once to float: in float, t * inv_freq at t ~ 4096 would
/// already carry an absolute error of ~2e-4 rad before the cos/sin.
template <class ExecSpace>
void rope_tables(const ExecSpace& space, const double theta,
                 const Matrix<ExecSpace, float>& cos,    // (T, D/2)
                 const Matrix<ExecSpace, float>& sin) {  // (T, D/2)
  const Index half = static_cast<Index>(cos.extent(1));
  const Index t_max = static_cast<Index>(cos.extent(0));
  Kokkos::parallel_for(
      "dst::kernels::rope_tables::angles", Range<ExecSpace>(space, 0, t_max * half),
      KOKKOS_LAMBDA(const Index k) {
        const Index t = k / half;
        const Index i = k - t * half;
        const double inv_freq =
            math::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(2 * half));
        const double angle = static_cast<double>(t) * inv_freq;
        cos(t, i) = static_cast<float>(math::cos(angle));
        sin(t, i) = static_cast<float>(math::sin(angle));
      });
}

/// In place over rows (b, t, h) of x viewed as (B*T*H, D). The inverse rotation (the
/// backward: a rotation's transpose is its inverse) is the same with sin negated, which is
/// exact, so forward then backward returns x up to two roundings per element.
template <class T, class ExecSpace>
void rope_apply(const ExecSpace& space, const char* label,
                const Matrix<ExecSpace, T>& x,              // (B*T*H, D)
                const Matrix<ExecSpace, const float>& cos,  // (>= T, D/2)
                const Matrix<ExecSpace, const float>& sin,  // (>= T, D/2)
                const Index t_len, const Index heads, const bool inverse) {
  const Index half = static_cast<Index>(cos.extent(1));
  const float sign = inverse ? -1.0f : 1.0f;
  Kokkos::parallel_for(
      label, Range<ExecSpace>(space, 0, static_cast<Index>(x.extent(0))),
      KOKKOS_LAMBDA(const Index row) {
        const Index t = (row / heads) % t_len;
        T* lo = &x(row, 0);
        T* hi = lo + half;
        const float* cr = &cos(t, 0);
        const float* sr = &sin(t, 0);
        for (Index i = 0; i < half; ++i) {
          const float a = to_float(lo[i]);
          const float b = to_float(hi[i]);
          const float s = sign * sr[i];
          lo[i] = from_float<T>(a * cr[i] - b * s);
          hi[i] = from_float<T>(b * cr[i] + a * s);
        }
      });
}

/// In place over rows (b, t, h) of x viewed as (B*T*H, W): the pairs (2i, 2i + 1) of the
/// last 2 * half columns, rotated by angle(t, i) (interleaved: DeepSeek's MLA).
template <class ExecSpace>
void rope_interleaved(const ExecSpace& space, const char* label,
                      const Matrix<ExecSpace, float>& x,          // (B*T*H, W)
                      const Matrix<ExecSpace, const float>& cos,  // (>= T, half)
                      const Matrix<ExecSpace, const float>& sin,  // (>= T, half)
                      const Index t_len, const Index heads, const bool inverse) {
  const Index half = static_cast<Index>(cos.extent(1));
  const Index first = static_cast<Index>(x.extent(1)) - 2 * half;
  const float sign = inverse ? -1.0f : 1.0f;
  Kokkos::parallel_for(
      label, Range<ExecSpace>(space, 0, static_cast<Index>(x.extent(0))),
      KOKKOS_LAMBDA(const Index row) {
        const Index t = (row / heads) % t_len;
        float* p = &x(row, first);
        const float* cr = &cos(t, 0);
        const float* sr = &sin(t, 0);
        for (Index i = 0; i < half; ++i) {
          const float a = p[2 * i];
          const float b = p[2 * i + 1];
          const float s = sign * sr[i];
          p[2 * i] = a * cr[i] - b * s;
          p[2 * i + 1] = b * cr[i] + a * s;
        }
      });
}

}  // namespace
}  // namespace detail

using Space = Kokkos::DefaultExecutionSpace;

void run(const kernels::detail::RopeTablesArgs& a) {
  using namespace detail;
  rope_tables(Space(), a.theta, Matrix<Space, float>(a.cos, a.t, a.half),
              Matrix<Space, float>(a.sin, a.t, a.half));
}

void run(const kernels::detail::RopeArgs& a) {
  using namespace detail;
  // The tables may hold more positions than x uses (sized for the longest sequence);
  // only their first T rows are read.
  rope_apply<float>(
      Space(),
      a.inverse ? "dst::kernels::rope_backward::rotate" : "dst::kernels::rope_forward::rotate",
      Matrix<Space, float>(a.x, a.b * a.t * a.h, 2 * a.half),
      Matrix<Space, const float>(a.cos, a.t, a.half),
      Matrix<Space, const float>(a.sin, a.t, a.half), a.t, a.h, a.inverse);
}

void run(const kernels::detail::RopeInterleavedArgs& a) {
  using namespace detail;
  rope_interleaved(Space(),
                   a.inverse ? "dst::kernels::rope_interleaved_backward::rotate"
                             : "dst::kernels::rope_interleaved_forward::rotate",
                   Matrix<Space, float>(a.x, a.b * a.t * a.h, a.width),
                   Matrix<Space, const float>(a.cos, a.t, a.half),
                   Matrix<Space, const float>(a.sin, a.t, a.half), a.t, a.h, a.inverse);
}

}  // namespace dst::kernels::kokkos_backend
