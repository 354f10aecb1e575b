// Elementwise kernels on the GPU: the residual add, gradient accumulation, zero fill, and
// the rounding that emulates 16-bit storage. Each is the Kokkos kernel's single float
// operation (or core/bf16.hpp's integer rounding) per element: bitwise equal results.
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/detail/common.cuh"

namespace dst::kernels::cuda_backend {
namespace detail {
namespace {

/// out may alias a or b: a thread loads its quad of both before storing it.
template <bool kVec>
__global__ void add_elements(const float* a, const float* b, float* out, const Index n) {
  for (Index q = grid_start(); q < ceil_div(n, 4); q += grid_stride()) {
    float x[4], y[4];
    load4<kVec>(a, 4 * q, n, x);
    load4<kVec>(b, 4 * q, n, y);
#pragma unroll
    for (int k = 0; k < 4; ++k)
      x[k] = x[k] + y[k];
    store4<kVec>(out, 4 * q, n, x);
  }
}

template <bool kVec>
__global__ void accumulate_elements(const float* x, float* y, const Index n) {
  for (Index q = grid_start(); q < ceil_div(n, 4); q += grid_stride()) {
    float xv[4], yv[4];
    load4<kVec>(x, 4 * q, n, xv);
    load4<kVec>(y, 4 * q, n, yv);
#pragma unroll
    for (int k = 0; k < 4; ++k)
      yv[k] = yv[k] + xv[k];
    store4<kVec>(y, 4 * q, n, yv);
  }
}

/// Integer arithmetic on the bits (math::round_to_bf16 / round_to_f16): no rounding mode
/// or flush-to-zero setting can change the result.
template <bool kVec, bool kF16>
__global__ void round_elements(float* x, const Index n) {
  for (Index q = grid_start(); q < ceil_div(n, 4); q += grid_stride()) {
    float v[4];
    load4<kVec>(x, 4 * q, n, v);
#pragma unroll
    for (int k = 0; k < 4; ++k)
      v[k] = kF16 ? math::round_to_f16(v[k]) : math::round_to_bf16(v[k]);
    store4<kVec>(x, 4 * q, n, v);
  }
}

}  // namespace
}  // namespace detail

void run(void* stream, const kernels::detail::AddArgs& a) {
  using namespace detail;
  const bool vec = aligned16(a.a) && aligned16(a.b) && aligned16(a.out);
  with_flag(vec, [&](auto kVec) {
    DST_CUDA_LAUNCH("dst::kernels::add::elements", add_elements<decltype(kVec)::value>,
                    element_grid(ceil_div(a.n, 4)), dim3(kElementThreads), stream_of(stream), a.a,
                    a.b, a.out, a.n);
  });
}

void run(void* stream, const kernels::detail::AccumulateArgs& a) {
  using namespace detail;
  const bool vec = aligned16(a.x) && aligned16(a.y);
  with_flag(vec, [&](auto kVec) {
    DST_CUDA_LAUNCH("dst::kernels::accumulate::elements",
                    accumulate_elements<decltype(kVec)::value>, element_grid(ceil_div(a.n, 4)),
                    dim3(kElementThreads), stream_of(stream), a.x, a.y, a.n);
  });
}

/// Zero bits are zero in every dtype (IEEE +0, integers, bf16/f16): a byte fill, whatever
/// the element width.
void run(void* stream, const kernels::detail::ZeroArgs& a) {
  DST_CUDA_CHECK(cudaMemsetAsync(a.data, 0, a.bytes, detail::stream_of(stream)));
}

void run(void* stream, const kernels::detail::RoundToStorageArgs& a) {
  using namespace detail;
  with_flag(aligned16(a.x), [&](auto kVec) {
    with_flag(a.f16, [&](auto kF16) {
      DST_CUDA_LAUNCH(
          a.f16 ? "dst::kernels::round_to_storage::f16" : "dst::kernels::round_to_storage::bf16",
          round_elements<decltype(kVec)::value, decltype(kF16)::value>,
          element_grid(ceil_div(a.n, 4)), dim3(kElementThreads), stream_of(stream), a.x, a.n);
    });
  });
}

}  // namespace dst::kernels::cuda_backend
