// SwiGLU gate: out = silu(h1) * h3, elementwise over (N, F).
#include "kernels/kokkos/detail/common.hpp"
#include "kernels/kokkos/kokkos_backend.hpp"

namespace dst::kernels::kokkos_backend {
namespace detail {
namespace {

template <class T, class ExecSpace>
void swiglu_forward(const ExecSpace& space, const Vector<ExecSpace, const T>& h1,  // (N*F)
                    const Vector<ExecSpace, const T>& h3,                          // (N*F)
                    const Vector<ExecSpace, T>& out) {                             // (N*F)
  Kokkos::parallel_for(
      "dst::kernels::swiglu_forward::elements",
      Range<ExecSpace>(space, 0, static_cast<Index>(out.extent(0))), KOKKOS_LAMBDA(const Index i) {
        const float x = to_float(h1(i));
        out(i) = from_float<T>(x * math::sigmoid(x) * to_float(h3(i)));
      });
}

/// silu'(x) = s (1 + x (1 - s)), s = sigmoid(x). Every input of element i is read before
/// either output of element i is written, so dh1/dh3 may alias h1/h3.
template <class T, class ExecSpace>
void swiglu_backward(const ExecSpace& space, const Vector<ExecSpace, const T>& dout,  // (N*F)
                     const Vector<ExecSpace, const T>& h1,                            // (N*F)
                     const Vector<ExecSpace, const T>& h3,                            // (N*F)
                     const Vector<ExecSpace, T>& dh1,                                 // (N*F)
                     const Vector<ExecSpace, T>& dh3) {                               // (N*F)
  Kokkos::parallel_for(
      "dst::kernels::swiglu_backward::elements",
      Range<ExecSpace>(space, 0, static_cast<Index>(dout.extent(0))), KOKKOS_LAMBDA(const Index i) {
        const float x = to_float(h1(i));
        const float g = to_float(h3(i));
        const float d = to_float(dout(i));
        const float s = math::sigmoid(x);
        dh1(i) = from_float<T>(d * g * (s * (1.0f + x * (1.0f - s))));
        dh3(i) = from_float<T>(d * (x * s));
      });
}

}  // namespace
}  // namespace detail

using Space = Kokkos::DefaultExecutionSpace;

void run(const kernels::detail::SwigluForwardArgs& a) {
  using namespace detail;
  swiglu_forward<float>(Space(), Vector<Space, const float>(a.h1, a.n),
                        Vector<Space, const float>(a.h3, a.n), Vector<Space, float>(a.out, a.n));
}

void run(const kernels::detail::SwigluBackwardArgs& a) {
  using namespace detail;
  swiglu_backward<float>(Space(), Vector<Space, const float>(a.dout, a.n),
                         Vector<Space, const float>(a.h1, a.n),
                         Vector<Space, const float>(a.h3, a.n), Vector<Space, float>(a.dh1, a.n),
                         Vector<Space, float>(a.dh3, a.n));
}

}  // namespace dst::kernels::kokkos_backend
