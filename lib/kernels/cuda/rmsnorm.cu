// RMSNorm on the GPU: out = x * rstd * w with rstd = 1 / sqrt(mean(x^2) + eps), a row group
// per row; the backward's dw in a deterministic two-pass column reduction.
#include <string>

#include "core/error.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/detail/common.cuh"

namespace dst::kernels::cuda_backend {
namespace detail {
namespace {

/// As the Kokkos kernel: the sum of squares in double (each square of a float is exact
/// there), rstd computed in double and rounded once, then x * r * w in float.
template <int kGroup, bool kVec>
__global__ void __launch_bounds__(RowGroup<kGroup>::kBlock)
    forward_rows(const float* x,  // (N, C)
                 const float* w,  // (C)
                 const float eps,
                 float* out,   // (N, C)
                 float* rstd,  // (N)
                 const Index n, const Index c) {
  using G = RowGroup<kGroup>;
  __shared__ double partial[G::kWarpsPerBlock];
  const Index row = G::row();
  const bool active = row < n;
  const Index quads = active ? ceil_div(c, 4) : 0;
  const float* xr = x + (active ? row : 0) * c;
  double ss = 0.0;
  for (Index q = G::rank(); q < quads; q += kGroup) {
    float v[4];
    load4<kVec>(xr, 4 * q, c, v);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const double d = v[k];
      ss += d * d;
    }
  }
  ss = G::sum(ss, partial);
  if (!active) return;  // after the group's last barrier
  const float r = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(c) + eps));
  if (G::rank() == 0) rstd[row] = r;
  float* yr = out + row * c;
  for (Index q = G::rank(); q < quads; q += kGroup) {
    float v[4], wv[4];
    load4<kVec>(xr, 4 * q, c, v);  // the row is still in L1/L2 from the first pass
    load4<kVec>(w, 4 * q, c, wv);
#pragma unroll
    for (int k = 0; k < 4; ++k)
      v[k] = v[k] * r * wv[k];
    store4<kVec>(yr, 4 * q, c, v);
  }
}

/// dx += rstd * (g - xhat * mean(g * xhat)), g = dout * w, xhat = x * rstd: the Kokkos
/// kernel's float expressions, the dot product accumulated in double.
template <int kGroup, bool kVec>
__global__ void __launch_bounds__(RowGroup<kGroup>::kBlock)
    backward_dx_rows(const float* dout,  // (N, C)
                     const float* x,     // (N, C)
                     const float* w,     // (C)
                     const float* rstd,  // (N)
                     float* dx,          // (N, C), accumulated
                     const Index n, const Index c) {
  using G = RowGroup<kGroup>;
  __shared__ double partial[G::kWarpsPerBlock];
  const Index row = G::row();
  const bool active = row < n;
  const Index quads = active ? ceil_div(c, 4) : 0;
  const Index base = (active ? row : 0) * c;
  const float r = active ? rstd[row] : 0.0f;
  double dot = 0.0;
  for (Index q = G::rank(); q < quads; q += kGroup) {
    float gv[4], xv[4], wv[4];
    load4<kVec>(dout + base, 4 * q, c, gv);
    load4<kVec>(x + base, 4 * q, c, xv);
    load4<kVec>(w, 4 * q, c, wv);
#pragma unroll
    for (int k = 0; k < 4; ++k)
      dot += static_cast<double>(gv[k] * wv[k] * (xv[k] * r));
  }
  dot = G::sum(dot, partial);
  if (!active) return;
  const float m = static_cast<float>(dot / static_cast<double>(c));
  for (Index q = G::rank(); q < quads; q += kGroup) {
    float gv[4], xv[4], wv[4], dv[4];
    load4<kVec>(dout + base, 4 * q, c, gv);
    load4<kVec>(x + base, 4 * q, c, xv);
    load4<kVec>(w, 4 * q, c, wv);
    load4<kVec>(dx + base, 4 * q, c, dv);
#pragma unroll
    for (int k = 0; k < 4; ++k)
      dv[k] = dv[k] + r * (gv[k] * wv[k] - (xv[k] * r) * m);
    store4<kVec>(dx + base, 4 * q, c, dv);
  }
}

// dw = sum over rows of dout * xhat. Pass 1: the rows are cut into at most kDwChunks
// consecutive chunks; thread (chunk, quad of columns) sums its chunk's rows in row order in
// double. Pass 2: one thread per column adds the chunk sums in chunk order and adds the
// float result to dw. Both orders are fixed by N alone. (Kokkos sums all rows of a column
// in one double chain; the two differ by a double rounding, far below float precision.)
constexpr Index kDwChunks = 128;  // 128 x C/4 threads: ~1e5 for C = 4096, enough for an H200
constexpr Index kDwMinRows = 32;  // per chunk: short chunks would be all launch overhead
constexpr int kDwThreads = 128;

Index dw_chunks(const Index n) {
  return std::min(kDwChunks, ceil_div(n, kDwMinRows));
}

template <bool kVec>
__global__ void __launch_bounds__(kDwThreads)
    backward_dw_partials(const float* dout,  // (N, C)
                         const float* x,     // (N, C)
                         const float* rstd,  // (N)
                         double* partials,   // (chunks, C)
                         const Index n, const Index c, const Index rows_per_chunk) {
  const Index j = (static_cast<Index>(blockIdx.x) * kDwThreads + threadIdx.x) * 4;
  if (j >= c) return;
  const Index chunk = blockIdx.y;
  const Index r0 = chunk * rows_per_chunk;
  const Index r1 = r0 + rows_per_chunk < n ? r0 + rows_per_chunk : n;
  double acc[4] = {0.0, 0.0, 0.0, 0.0};
  for (Index row = r0; row < r1; ++row) {
    float gv[4], xv[4];
    load4<kVec>(dout + row * c, j, c, gv);
    load4<kVec>(x + row * c, j, c, xv);
    const float r = rstd[row];
#pragma unroll
    for (int k = 0; k < 4; ++k)
      acc[k] += static_cast<double>(gv[k] * (xv[k] * r));
  }
  double* out = partials + chunk * c;
#pragma unroll
  for (int k = 0; k < 4; ++k)
    if (j + k < c) out[j + k] = acc[k];
}

__global__ void backward_dw_finish(const double* partials,  // (chunks, C)
                                   float* dw,               // (C), accumulated
                                   const Index chunks, const Index c) {
  for (Index j = grid_start(); j < c; j += grid_stride()) {
    double acc = 0.0;
    for (Index k = 0; k < chunks; ++k)
      acc += partials[k * c + j];
    dw[j] = dw[j] + static_cast<float>(acc);
  }
}

}  // namespace
}  // namespace detail

void run(void* stream, const kernels::detail::RmsnormForwardArgs& a) {
  using namespace detail;
  const cudaStream_t s = stream_of(stream);
  const bool vec = a.c % 4 == 0 && aligned16(a.x) && aligned16(a.w) && aligned16(a.out);
  with_group(group_for(a.c), [&](auto group) {
    constexpr int kGroup = decltype(group)::value;
    with_flag(vec, [&](auto kVec) {
      DST_CUDA_LAUNCH("dst::kernels::rmsnorm_forward::rows",
                      forward_rows<kGroup, decltype(kVec)::value>,
                      row_grid<kGroup>(a.n, "rmsnorm_forward"), dim3(RowGroup<kGroup>::kBlock), s,
                      a.x, a.w, a.eps, a.out, a.rstd, a.n, a.c);
    });
  });
}

void run(void* stream, const kernels::detail::RmsnormBackwardArgs& a) {
  using namespace detail;
  const cudaStream_t s = stream_of(stream);
  const bool vec_dx =
      a.c % 4 == 0 && aligned16(a.dout) && aligned16(a.x) && aligned16(a.w) && aligned16(a.dx);
  with_group(group_for(a.c), [&](auto group) {
    constexpr int kGroup = decltype(group)::value;
    with_flag(vec_dx, [&](auto kVec) {
      DST_CUDA_LAUNCH("dst::kernels::rmsnorm_backward::dx",
                      backward_dx_rows<kGroup, decltype(kVec)::value>,
                      row_grid<kGroup>(a.n, "rmsnorm_backward"), dim3(RowGroup<kGroup>::kBlock), s,
                      a.dout, a.x, a.w, a.rstd, a.dx, a.n, a.c);
    });
  });

  const Index chunks = dw_chunks(a.n);
  const Index rows_per_chunk = ceil_div(a.n, chunks);
  const Index column_blocks = ceil_div(ceil_div(a.c, 4), kDwThreads);
  ScratchLayout layout;
  const std::size_t partials_at = layout.add(sizeof(double) * chunks * a.c);
  const Scratch sc = scratch(s, layout.bytes());
  auto* partials = reinterpret_cast<double*>(sc.device + partials_at);
  const bool vec_dw = a.c % 4 == 0 && aligned16(a.dout) && aligned16(a.x);
  with_flag(vec_dw, [&](auto kVec) {
    DST_CUDA_LAUNCH("dst::kernels::rmsnorm_backward::dw_partials",
                    backward_dw_partials<decltype(kVec)::value>,
                    dim3(static_cast<unsigned>(column_blocks), static_cast<unsigned>(chunks)),
                    dim3(kDwThreads), s, a.dout, a.x, a.rstd, partials, a.n, a.c, rows_per_chunk);
  });
  DST_CUDA_LAUNCH("dst::kernels::rmsnorm_backward::dw_finish", backward_dw_finish,
                  element_grid(a.c), dim3(kElementThreads), s, partials, a.dw, chunks, a.c);
}

}  // namespace dst::kernels::cuda_backend
