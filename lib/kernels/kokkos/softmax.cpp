// Causal softmax over attention scores viewed as rows (b, h, i) of length T: row i keeps
// columns j <= i and is exactly 0 beyond.
#include "kernels/kokkos/detail/common.hpp"
#include "kernels/kokkos/kokkos_backend.hpp"

namespace dst::kernels::kokkos_backend {
namespace detail {
namespace {

/// Passes over the row's i+1 live entries (max, exp, sum, normalise); the
/// masked entries j > i are never read, so the caller may leave anything there. probs may
/// alias scores: each pass reads an entry before writing the same entry.
template <class T, class ExecSpace>
void causal_softmax_forward(const ExecSpace& space,
                            const Matrix<ExecSpace, const T>& scores,                // (B*H*T, T)
                            const float scale, const Matrix<ExecSpace, T>& probs) {  // (B*H*T, T)
  const Index t_len = static_cast<Index>(scores.extent(1));
  Kokkos::parallel_for(
      "dst::kernels::causal_softmax_forward::rows",
      Range<ExecSpace>(space, 0, static_cast<Index>(scores.extent(0))),
      KOKKOS_LAMBDA(const Index row) {
        const Index live = row % t_len + 1;  // columns j <= i
        const T* s = &scores(row, 0);
        T* p = &probs(row, 0);
        const float m = row_max(live, [&](const Index j) { return scale * to_float(s[j]); });
        // Separate simple passes (exp, then sum) vectorise; the row is still in L1.
        for (Index j = 0; j < live; ++j)
          p[j] = from_float<T>(math::fast_exp(scale * to_float(s[j]) - m));
        const double sum = lane_sum(live, [&](const Index j) { return to_float(p[j]); });
        // sum >= 1 (the max's own term is exp(0)), so the reciprocal is safe.
        const float inv = static_cast<float>(1.0 / sum);
        for (Index j = 0; j < live; ++j)
          p[j] = from_float<T>(to_float(p[j]) * inv);
        for (Index j = live; j < t_len; ++j)
          p[j] = from_float<T>(0.0f);
      });
}

/// dscores = scale * p * (dp - sum_j p * dp). dscores may alias dprobs (the dot product
/// is complete before the first write).
template <class T, class ExecSpace>
void causal_softmax_backward(const ExecSpace& space,
                             const Matrix<ExecSpace, const T>& probs,   // (B*H*T, T)
                             const Matrix<ExecSpace, const T>& dprobs,  // (B*H*T, T)
                             const float scale,
                             const Matrix<ExecSpace, T>& dscores) {  // (B*H*T, T)
  const Index t_len = static_cast<Index>(probs.extent(1));
  Kokkos::parallel_for(
      "dst::kernels::causal_softmax_backward::rows",
      Range<ExecSpace>(space, 0, static_cast<Index>(probs.extent(0))),
      KOKKOS_LAMBDA(const Index row) {
        const Index live = row % t_len + 1;
        const T* p = &probs(row, 0);
        const T* dp = &dprobs(row, 0);
        T* ds = &dscores(row, 0);
        const float dot = static_cast<float>(
            lane_sum(live, [&](const Index j) { return to_float(p[j]) * to_float(dp[j]); }));
        for (Index j = 0; j < live; ++j)
          ds[j] = from_float<T>(scale * to_float(p[j]) * (to_float(dp[j]) - dot));
        for (Index j = live; j < t_len; ++j)
          ds[j] = from_float<T>(0.0f);
      });
}

}  // namespace
}  // namespace detail

using Space = Kokkos::DefaultExecutionSpace;

void run(const kernels::detail::SoftmaxForwardArgs& a) {
  using namespace detail;
  causal_softmax_forward<float>(Space(), Matrix<Space, const float>(a.scores, a.rows, a.t), a.scale,
                                Matrix<Space, float>(a.probs, a.rows, a.t));
}

void run(const kernels::detail::SoftmaxBackwardArgs& a) {
  using namespace detail;
  causal_softmax_backward<float>(Space(), Matrix<Space, const float>(a.probs, a.rows, a.t),
                                 Matrix<Space, const float>(a.dprobs, a.rows, a.t), a.scale,
                                 Matrix<Space, float>(a.dscores, a.rows, a.t));
}

}  // namespace dst::kernels::kokkos_backend
