// Cross-entropy over the vocabulary, alone or fused with its gradient.
#include <string>

#include "kernels/kokkos/detail/common.hpp"
#include "kernels/kokkos/kokkos_backend.hpp"

namespace dst::kernels::kokkos_backend {
namespace detail {
namespace {

template <class ExecSpace>
void check_targets(const ExecSpace& space, const char* kernel,
                   const Vector<ExecSpace, const std::int32_t>& targets, const Index v,
                   const std::int32_t ignore_index) {
  const std::string op = std::string("dst::kernels::") + kernel;
  const Index bad = first_bad_id(space, op + "::check_targets", targets, v, true, ignore_index);
  if (bad < 0) return;
  const std::int32_t id = id_at(space, op + "::read_bad_target", targets, bad);
  throw Error(std::string("kernels::") + kernel + ": target " + std::to_string(id) +
              " at position " + std::to_string(bad) + " is outside the vocabulary [0, " +
              std::to_string(v) + ") and is not the ignore index " + std::to_string(ignore_index));
}

/// One row per work item: max, then sum of exp(l - max) in double (lane_sum: V reaches
/// 1e5, where a float sum could lose 6e-3 relative), then loss = log(sum) + max - l[t].
/// With a gradient (`fused`), the second pass stores exp(l - max) in dlogits and a third
/// scales it; the target's logit is read before the second pass, so dlogits may alias
/// logits. exp is evaluated once per logit.
template <class T, bool fused, class ExecSpace>
void cross_entropy(const ExecSpace& space, const char* label,
                   const Matrix<ExecSpace, const T>& logits,              // (N, V)
                   const Vector<ExecSpace, const std::int32_t>& targets,  // (N)
                   const std::int32_t ignore_index, const float grad_scale,
                   const Vector<ExecSpace, float>& losses,  // (N)
                   const Matrix<ExecSpace, T>& dlogits) {   // (N, V) if fused
  const Index v = static_cast<Index>(logits.extent(1));
  Kokkos::parallel_for(
      label, Range<ExecSpace>(space, 0, static_cast<Index>(logits.extent(0))),
      KOKKOS_LAMBDA(const Index n) {
        const std::int32_t t = targets(n);
        if (t == ignore_index) {
          losses(n) = 0.0f;
          if (fused) {
            T* d = &dlogits(n, 0);
            for (Index j = 0; j < v; ++j)
              d[j] = from_float<T>(0.0f);
          }
          return;
        }
        const T* l = &logits(n, 0);
        const float target_logit = to_float(l[t]);
        const float m = row_max(v, [&](const Index j) { return to_float(l[j]); });
        double sum;
        if (fused) {
          T* d = &dlogits(n, 0);
          for (Index j = 0; j < v; ++j)
            d[j] = from_float<T>(math::fast_exp(to_float(l[j]) - m));
          sum = lane_sum(v, [&](const Index j) { return to_float(d[j]); });
          // softmax * grad_scale in one factor; sum >= 1 (the max's term is exp(0)).
          const float f = static_cast<float>(static_cast<double>(grad_scale) / sum);
          for (Index j = 0; j < v; ++j)
            d[j] = from_float<T>(to_float(d[j]) * f);
          d[t] = from_float<T>(to_float(d[t]) - grad_scale);
        } else {
          sum = lane_sum(v, [&](const Index j) { return math::fast_exp(to_float(l[j]) - m); });
        }
        losses(n) = static_cast<float>(math::log(sum) + static_cast<double>(m) -
                                       static_cast<double>(target_logit));
      });
}

}  // namespace
}  // namespace detail

using Space = Kokkos::DefaultExecutionSpace;

void run(const kernels::detail::CrossEntropyArgs& a) {
  using namespace detail;
  const Space space;
  const Vector<Space, const std::int32_t> targets(a.targets, a.n);
  const Matrix<Space, const float> logits(a.logits, a.n, a.v);
  const Vector<Space, float> losses(a.losses, a.n);
  if (a.dlogits == nullptr) {
    check_targets(space, "cross_entropy_forward", targets, a.v, a.ignore_index);
    cross_entropy<float, false>(space, "dst::kernels::cross_entropy_forward::rows", logits, targets,
                                a.ignore_index, a.grad_scale, losses, Matrix<Space, float>());
  } else {
    check_targets(space, "cross_entropy_fused", targets, a.v, a.ignore_index);
    cross_entropy<float, true>(space, "dst::kernels::cross_entropy_fused::rows", logits, targets,
                               a.ignore_index, a.grad_scale, losses,
                               Matrix<Space, float>(a.dlogits, a.n, a.v));
  }
}

}  // namespace dst::kernels::kokkos_backend
