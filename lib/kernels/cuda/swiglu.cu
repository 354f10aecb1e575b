// SwiGLU gate on the GPU: out = silu(h1) * h3, elementwise over (N, F), with the Kokkos
// kernels' sigmoid and float operations (bitwise equal results).
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/detail/common.cuh"

namespace dst::kernels::cuda_backend {
namespace detail {
namespace {

template <bool kVec>
__global__ void forward_elements(const float* h1,  // (N*F)
                                 const float* h3,  // (N*F)
                                 float* out,       // (N*F)
                                 const Index n) {
  for (Index q = grid_start(); q < ceil_div(n, 4); q += grid_stride()) {
    float x[4], g[4];
    load4<kVec>(h1, 4 * q, n, x);
    load4<kVec>(h3, 4 * q, n, g);
#pragma unroll
    for (int k = 0; k < 4; ++k)
      x[k] = x[k] * math::sigmoid(x[k]) * g[k];
    store4<kVec>(out, 4 * q, n, x);
  }
}

/// silu'(x) = s (1 + x (1 - s)), s = sigmoid(x). A thread loads every input of its quad
/// before storing either output, so dh1/dh3 may alias h1/h3.
template <bool kVec>
__global__ void backward_elements(const float* dout,  // (N*F)
                                  const float* h1,    // (N*F)
                                  const float* h3,    // (N*F)
                                  float* dh1,         // (N*F)
                                  float* dh3,         // (N*F)
                                  const Index n) {
  for (Index q = grid_start(); q < ceil_div(n, 4); q += grid_stride()) {
    float x[4], g[4], d[4];
    load4<kVec>(h1, 4 * q, n, x);
    load4<kVec>(h3, 4 * q, n, g);
    load4<kVec>(dout, 4 * q, n, d);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float s = math::sigmoid(x[k]);
      const float d1 = d[k] * g[k] * (s * (1.0f + x[k] * (1.0f - s)));
      const float d3 = d[k] * (x[k] * s);
      x[k] = d1;
      g[k] = d3;
    }
    store4<kVec>(dh1, 4 * q, n, x);
    store4<kVec>(dh3, 4 * q, n, g);
  }
}

}  // namespace
}  // namespace detail

void run(void* stream, const kernels::detail::SwigluForwardArgs& a) {
  using namespace detail;
  const bool vec = aligned16(a.h1) && aligned16(a.h3) && aligned16(a.out);
  with_flag(vec, [&](auto kVec) {
    DST_CUDA_LAUNCH("dst::kernels::swiglu_forward::elements",
                    forward_elements<decltype(kVec)::value>, element_grid(ceil_div(a.n, 4)),
                    dim3(kElementThreads), stream_of(stream), a.h1, a.h3, a.out, a.n);
  });
}

void run(void* stream, const kernels::detail::SwigluBackwardArgs& a) {
  using namespace detail;
  const bool vec = aligned16(a.dout) && aligned16(a.h1) && aligned16(a.h3) && aligned16(a.dh1) &&
                   aligned16(a.dh3);
  with_flag(vec, [&](auto kVec) {
    DST_CUDA_LAUNCH("dst::kernels::swiglu_backward::elements",
                    backward_elements<decltype(kVec)::value>, element_grid(ceil_div(a.n, 4)),
                    dim3(kElementThreads), stream_of(stream), a.dout, a.h1, a.h3, a.dh1, a.dh3,
                    a.n);
  });
}

}  // namespace dst::kernels::cuda_backend
