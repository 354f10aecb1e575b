// DeepSeekMoE's token movement on the GPU: the transpose of the gather of token rows (the
// gather is the embedding's, embedding.cu), and the weighted combine with its backward.
// Each output quad is owned by one thread that adds the slots in order k = 0 .. K-1 as the
// Kokkos back end does (no float atomics): the transpose, the combine and d_y are bitwise
// equal to Kokkos'; d_weights is a warp's double-precision dot product (a fixed tree, so the same
// bits on every run, but not Kokkos' sequential order).
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/detail/common.cuh"

namespace dst::kernels::cuda_backend {
namespace detail {
namespace {

/// out[n, j..] += w[n, 0] y[row[n, 0], j..] + w[n, 1] y[row[n, 1], j..] + ..., in slot
/// order (each product rounded, then added: -fmad=false, as the Kokkos loop); w = 1
/// without weights (gather_rows' transpose: 1 * y is y, a plain sum's bits).
template <bool kVec>
__global__ void add_slot_rows(const float* y,           // (R, C)
                              const std::int32_t* row,  // (N, K)
                              const float* weights,     // (N, K), or nullptr
                              float* out,               // (N, C)
                              const Index n, const Index k_slots, const Index c) {
  const Index quads = ceil_div(c, 4);
  for (Index q = grid_start(); q < n * quads; q += grid_stride()) {
    const Index t = q / quads;
    const Index j = (q - t * quads) * 4;
    float acc[4];
    load4<kVec>(out + t * c, j, c, acc);
    for (Index k = 0; k < k_slots; ++k) {
      const float w = weights != nullptr ? weights[t * k_slots + k] : 1.0f;
      float v[4];
      load4<kVec>(y + static_cast<Index>(row[t * k_slots + k]) * c, j, c, v);
#pragma unroll
      for (int e = 0; e < 4; ++e)
        acc[e] += w * v[e];
    }
    store4<kVec>(out + t * c, j, c, acc);
  }
}

/// One warp per (token, slot): d_y[row, :] = w dout[n, :] and d_weights = dout[n, :] .
/// y[row, :], the lanes' double partials combined by warp_sum's fixed tree.
template <bool kVec>
__global__ void combine_backward_slots(const float* dout,        // (N, C)
                                       const float* y,           // (R, C)
                                       const std::int32_t* row,  // (N, K)
                                       const float* weights,     // (N, K)
                                       float* d_y,               // (R, C)
                                       float* d_weights,         // (N, K)
                                       const Index slots, const Index k_slots, const Index c) {
  const Index warp = grid_start() / kWarp;
  const Index warps = grid_stride() / kWarp;
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  for (Index p = warp; p < slots; p += warps) {
    const Index t = p / k_slots;
    const Index r = row[p];
    const float w = weights[p];
    double dot = 0.0;
    for (Index j = 4 * static_cast<Index>(lane); j < c; j += 4 * kWarp) {
      float d[4], v[4], g[4];
      load4<kVec>(dout + t * c, j, c, d);
      load4<kVec>(y + r * c, j, c, v);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        g[e] = w * d[e];
        dot += static_cast<double>(d[e]) * v[e];
      }
      store4<kVec>(d_y + r * c, j, c, g);
    }
    dot = warp_sum(dot);
    if (lane == 0) d_weights[p] = static_cast<float>(dot);
  }
}

}  // namespace
}  // namespace detail

void run(void* stream, const kernels::detail::GatherRowsBackwardArgs& a) {
  using namespace detail;
  const bool vec = a.c % 4 == 0 && aligned16(a.d_out) && aligned16(a.dx);
  with_flag(vec, [&](auto kVec) {
    DST_CUDA_LAUNCH("dst::kernels::gather_rows_backward::tokens",
                    add_slot_rows<decltype(kVec)::value>, element_grid(a.n * ceil_div(a.c, 4)),
                    dim3(kElementThreads), stream_of(stream), a.d_out, a.row,
                    static_cast<const float*>(nullptr), a.dx, a.n, a.k, a.c);
  });
}

void run(void* stream, const kernels::detail::MoeCombineForwardArgs& a) {
  using namespace detail;
  const bool vec = a.c % 4 == 0 && aligned16(a.y) && aligned16(a.out);
  with_flag(vec, [&](auto kVec) {
    DST_CUDA_LAUNCH("dst::kernels::moe_combine_forward::tokens",
                    add_slot_rows<decltype(kVec)::value>, element_grid(a.n * ceil_div(a.c, 4)),
                    dim3(kElementThreads), stream_of(stream), a.y, a.row, a.weights, a.out, a.n,
                    a.k, a.c);
  });
}

void run(void* stream, const kernels::detail::MoeCombineBackwardArgs& a) {
  using namespace detail;
  const bool vec = a.c % 4 == 0 && aligned16(a.dout) && aligned16(a.y) && aligned16(a.d_y);
  const Index slots = a.n * a.k;
  with_flag(vec, [&](auto kVec) {
    DST_CUDA_LAUNCH("dst::kernels::moe_combine_backward::slots",
                    combine_backward_slots<decltype(kVec)::value>, element_grid(slots * kWarp),
                    dim3(kElementThreads), stream_of(stream), a.dout, a.y, a.row, a.weights, a.d_y,
                    a.d_weights, slots, a.k, a.c);
  });
}

}  // namespace dst::kernels::cuda_backend
