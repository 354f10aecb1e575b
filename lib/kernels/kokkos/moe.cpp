// DeepSeekMoE's token movement: the transpose of the gather of token rows (the gather is
// the embedding's, embedding.cpp), and the weighted combine with its backward. Every output
// element is owned by one work item and summed in slot order: deterministic, no atomics.
#include "kernels/kokkos/detail/common.hpp"
#include "kernels/kokkos/kokkos_backend.hpp"

namespace dst::kernels::kokkos_backend {
namespace detail {
namespace {

/// out[n, :] += sum_k w[n, k] y[row[n, k], :], slots in order; w = 1 without weights (the
/// transpose of gather_rows: 1 * y is y, the same bits as a plain sum).
template <class ExecSpace>
void add_slot_rows(const ExecSpace& space, const Matrix<ExecSpace, const float>& y,  // (R, C)
                   const Matrix<ExecSpace, const std::int32_t>& row,                 // (N, K)
                   const Matrix<ExecSpace, const float>& weights,             // (N, K), or empty
                   const Matrix<ExecSpace, float>& out, const char* label) {  // (N, C)
  const Index k_slots = static_cast<Index>(row.extent(1));
  const Index c = static_cast<Index>(out.extent(1));
  const bool weighted = weights.extent(0) > 0;
  Kokkos::parallel_for(
      label, Range<ExecSpace>(space, 0, static_cast<Index>(out.extent(0))),
      KOKKOS_LAMBDA(const Index n) {
        float* o = &out(n, 0);
        for (Index k = 0; k < k_slots; ++k) {
          const float w = weighted ? weights(n, k) : 1.0f;
          const float* yr = &y(row(n, k), 0);
          for (Index j = 0; j < c; ++j)
            o[j] += w * yr[j];
        }
      });
}

/// One work item per (token, slot): its row of d_y is written once (rows are distinct),
/// its weight's gradient summed over the columns in order, in double.
template <class ExecSpace>
void moe_combine_backward(const ExecSpace& space,
                          const Matrix<ExecSpace, const float>& dout,        // (N, C)
                          const Matrix<ExecSpace, const float>& y,           // (R, C)
                          const Matrix<ExecSpace, const std::int32_t>& row,  // (N, K)
                          const Matrix<ExecSpace, const float>& weights,     // (N, K)
                          const Matrix<ExecSpace, float>& d_y,               // (R, C)
                          const Matrix<ExecSpace, float>& d_weights) {       // (N, K)
  const Index k_slots = static_cast<Index>(row.extent(1));
  const Index c = static_cast<Index>(dout.extent(1));
  Kokkos::parallel_for(
      "dst::kernels::moe_combine_backward::slots",
      Range<ExecSpace>(space, 0, static_cast<Index>(row.extent(0)) * k_slots),
      KOKKOS_LAMBDA(const Index p) {
        const Index n = p / k_slots, k = p - n * k_slots;
        const Index r = row(n, k);
        const float w = weights(n, k);
        const float* d = &dout(n, 0);
        const float* yr = &y(r, 0);
        float* dy = &d_y(r, 0);
        double dot = 0.0;
        for (Index j = 0; j < c; ++j) {
          dy[j] = w * d[j];
          dot += static_cast<double>(d[j]) * yr[j];
        }
        d_weights(n, k) = static_cast<float>(dot);
      });
}

}  // namespace
}  // namespace detail

using Space = Kokkos::DefaultExecutionSpace;

void run(const kernels::detail::GatherRowsBackwardArgs& a) {
  using namespace detail;
  add_slot_rows(Space(), Matrix<Space, const float>(a.d_out, a.n * a.k, a.c),
                Matrix<Space, const std::int32_t>(a.row, a.n, a.k),
                Matrix<Space, const float>(nullptr, 0, a.k), Matrix<Space, float>(a.dx, a.n, a.c),
                "dst::kernels::gather_rows_backward::tokens");
}

void run(const kernels::detail::MoeCombineForwardArgs& a) {
  using namespace detail;
  add_slot_rows(Space(), Matrix<Space, const float>(a.y, a.n * a.k, a.c),
                Matrix<Space, const std::int32_t>(a.row, a.n, a.k),
                Matrix<Space, const float>(a.weights, a.n, a.k),
                Matrix<Space, float>(a.out, a.n, a.c), "dst::kernels::moe_combine_forward::tokens");
}

void run(const kernels::detail::MoeCombineBackwardArgs& a) {
  using namespace detail;
  moe_combine_backward(Space(), Matrix<Space, const float>(a.dout, a.n, a.c),
                       Matrix<Space, const float>(a.y, a.n * a.k, a.c),
                       Matrix<Space, const std::int32_t>(a.row, a.n, a.k),
                       Matrix<Space, const float>(a.weights, a.n, a.k),
                       Matrix<Space, float>(a.d_y, a.n * a.k, a.c),
                       Matrix<Space, float>(a.d_weights, a.n, a.k));
}

}  // namespace dst::kernels::kokkos_backend
