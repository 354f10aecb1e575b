// AdamW: one fused pass per element over parameters, gradients and the two moments.
#include "kernels/kokkos/detail/common.hpp"
#include "kernels/kokkos/kokkos_backend.hpp"

namespace dst::kernels::kokkos_backend {
namespace detail {
namespace {

/// PyTorch's torch.optim.AdamW single-tensor update, operation for operation in float (see
/// kernels.hpp), so that parity with it is a matter of a few ulps, not of a formula:
///   param.mul_(1 - lr*wd); exp_avg.lerp_(g, 1 - beta1);
///   exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2);
///   denom = exp_avg_sq.sqrt() / sqrt(bias2) + eps; param.addcdiv_(exp_avg, denom, -step_size)
template <class ExecSpace>
void adamw(const ExecSpace& space, const Vector<ExecSpace, float>& params,  // (n)
           const Vector<ExecSpace, const float>& grads,                     // (n)
           const Vector<ExecSpace, float>& m,                               // (n)
           const Vector<ExecSpace, float>& v,                               // (n)
           const kernels::detail::AdamwArgs& a) {
  // The lambda captures the float constants as doubles, each converting back to exactly
  // the float it was: a float store (params, m, v) may alias a captured float (type-based
  // aliasing), which made the compiler reload every constant per element and left the
  // loop scalar; a double it may not alias, so the loop vectorises (the same bits).
  const double grad_scale = a.grad_scale;
  const double decay = a.decay;
  const double w = a.lerp_weight;
  const double beta2 = a.beta2;
  const double one_minus_beta2 = a.one_minus_beta2;
  const double neg_step_size = -a.step_size;
  const double bias2_sqrt = a.bias2_sqrt;
  const double eps = a.eps;
  // ATen's lerp: self + w (end - self) for |w| < 0.5, else end - (end - self)(1 - w); the
  // two forms are equal in exact arithmetic and each is the accurate one on its side.
  const bool small_weight = a.lerp_weight < 0.5f;
  const double one_minus_w = 1.0f - a.lerp_weight;  // computed in float, held exactly
  Kokkos::parallel_for(
      "dst::kernels::adamw_step::elements",
      Range<ExecSpace>(space, 0, static_cast<Index>(params.extent(0))),
      KOKKOS_LAMBDA(const Index i) {
        const auto f = [](double x) { return static_cast<float>(x); };
        const float g = grads(i) * f(grad_scale);
        const float p = params(i) * f(decay);
        const float mi = m(i);
        const float m_new = small_weight ? mi + f(w) * (g - mi) : g - (g - mi) * f(one_minus_w);
        const float v_new = v(i) * f(beta2) + f(one_minus_beta2) * g * g;
        // The correctly rounded float sqrt: the bits of PyTorch's (sqrtf). Through double
        // it was the same bits at twice the cost; the loop is bound by the square roots.
        const float root = math::sqrt(v_new);
        const float denom = root / f(bias2_sqrt) + f(eps);
        m(i) = m_new;
        v(i) = v_new;
        params(i) = p + f(neg_step_size) * (m_new / denom);
      });
}

}  // namespace
}  // namespace detail

using Space = Kokkos::DefaultExecutionSpace;

void run(const kernels::detail::AdamwArgs& a) {
  using namespace detail;
  adamw(Space(), Vector<Space, float>(a.params, a.n), Vector<Space, const float>(a.grads, a.n),
        Vector<Space, float>(a.m, a.n), Vector<Space, float>(a.v, a.n), a);
}

}  // namespace dst::kernels::kokkos_backend
