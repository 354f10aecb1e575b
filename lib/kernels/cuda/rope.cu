// Rotary position embeddings on the GPU, rotate-half convention: dimension i pairs with
// i + D/2 and rotates by angle(t, i) = t * theta^(-2i/D). Elementwise: the same float
// operations as the Kokkos kernels, so the rotation's results are bitwise equal to them.
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/detail/common.cuh"

namespace dst::kernels::cuda_backend {
namespace detail {
namespace {

/// Angles in double, rounded once to float (Kokkos' formula; the device's double pow,
/// cos and sin are within 2 ulp of the correctly rounded double, so the float tables agree
/// with the host's except where a double lands within ~1e-16 of a float rounding boundary).
__global__ void tables(const double theta,
                       float* cos_table,  // (T, D/2)
                       float* sin_table,  // (T, D/2)
                       const Index t_max, const Index half) {
  for (Index k = grid_start(); k < t_max * half; k += grid_stride()) {
    const Index t = k / half;
    const Index i = k - t * half;
    const double inv_freq =
        pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(2 * half));
    const double angle = static_cast<double>(t) * inv_freq;
    cos_table[k] = static_cast<float>(cos(angle));
    sin_table[k] = static_cast<float>(sin(angle));
  }
}

/// In place over rows (b, t, h) of x viewed as (B*T*H, D): one thread per quad of pairs
/// (i..i+3, i+D/2..i+D/2+3). The inverse rotation negates sin, which is exact.
template <bool kVec>
__global__ void rotate(float* x,                // (B*T*H, D)
                       const float* cos_table,  // (>= T, D/2)
                       const float* sin_table,  // (>= T, D/2)
                       const Index rows, const Index t_len, const Index heads, const Index half,
                       const float sign) {
  const Index quads = ceil_div(half, 4);
  for (Index k = grid_start(); k < rows * quads; k += grid_stride()) {
    const Index row = k / quads;
    const Index i = (k - row * quads) * 4;
    const Index t = (row / heads) % t_len;
    float* lo = x + row * 2 * half;
    float* hi = lo + half;
    float a[4], b[4], cv[4], sv[4];
    load4<kVec>(lo, i, half, a);
    load4<kVec>(hi, i, half, b);
    load4<kVec>(cos_table + t * half, i, half, cv);
    load4<kVec>(sin_table + t * half, i, half, sv);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float s = sign * sv[q];
      const float new_lo = a[q] * cv[q] - b[q] * s;
      const float new_hi = b[q] * cv[q] + a[q] * s;
      a[q] = new_lo;
      b[q] = new_hi;
    }
    store4<kVec>(lo, i, half, a);
    store4<kVec>(hi, i, half, b);
  }
}

/// In place over rows (b, t, h) of x viewed as (B*T*H, W): one thread per pair (2i, 2i+1)
/// of the last 2 * half columns (interleaved: DeepSeek's MLA). The Kokkos kernel's float
/// operations, so the results are bitwise equal to it.
__global__ void rotate_interleaved(float* x,                // (B*T*H, W)
                                   const float* cos_table,  // (>= T, half)
                                   const float* sin_table,  // (>= T, half)
                                   const Index rows, const Index t_len, const Index heads,
                                   const Index width, const Index half, const float sign) {
  for (Index k = grid_start(); k < rows * half; k += grid_stride()) {
    const Index row = k / half;
    const Index i = k - row * half;
    const Index t = (row / heads) % t_len;
    float* p = x + row * width + (width - 2 * half) + 2 * i;
    const float a = p[0];
    const float b = p[1];
    const float c = cos_table[t * half + i];
    const float s = sign * sin_table[t * half + i];
    p[0] = a * c - b * s;
    p[1] = b * c + a * s;
  }
}

}  // namespace
}  // namespace detail

void run(void* stream, const kernels::detail::RopeTablesArgs& a) {
  using namespace detail;
  const cudaStream_t s = stream_of(stream);
  DST_CUDA_LAUNCH("dst::kernels::rope_tables::angles", tables, element_grid(a.t * a.half),
                  dim3(kElementThreads), s, a.theta, a.cos, a.sin, a.t, a.half);
}

void run(void* stream, const kernels::detail::RopeArgs& a) {
  using namespace detail;
  const cudaStream_t s = stream_of(stream);
  const Index rows = a.b * a.t * a.h;
  // Both halves of a row and the table rows start 16-byte aligned when D/2 % 4 == 0.
  const bool vec = a.half % 4 == 0 && aligned16(a.x) && aligned16(a.cos) && aligned16(a.sin);
  const float sign = a.inverse ? -1.0f : 1.0f;
  with_flag(vec, [&](auto kVec) {
    DST_CUDA_LAUNCH(
        a.inverse ? "dst::kernels::rope_backward::rotate" : "dst::kernels::rope_forward::rotate",
        rotate<decltype(kVec)::value>, element_grid(rows * ceil_div(a.half, 4)),
        dim3(kElementThreads), s, a.x, a.cos, a.sin, rows, a.t, a.h, a.half, sign);
  });
}

void run(void* stream, const kernels::detail::RopeInterleavedArgs& a) {
  using namespace detail;
  const cudaStream_t s = stream_of(stream);
  const Index rows = a.b * a.t * a.h;
  DST_CUDA_LAUNCH(a.inverse ? "dst::kernels::rope_interleaved_backward::rotate"
                            : "dst::kernels::rope_interleaved_forward::rotate",
                  rotate_interleaved, element_grid(rows * a.half), dim3(kElementThreads), s, a.x,
                  a.cos, a.sin, rows, a.t, a.h, a.width, a.half, a.inverse ? -1.0f : 1.0f);
}

}  // namespace dst::kernels::cuda_backend
