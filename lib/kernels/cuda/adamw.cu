// AdamW on the GPU: one fused pass per element over parameters, gradients and the two
// moments.
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/detail/common.cuh"

namespace dst::kernels::cuda_backend {
namespace detail {
namespace {

/// The Kokkos kernel's update (PyTorch's torch.optim.AdamW single-tensor path, see
/// kernels.hpp), the same float operations in the same order, each written as its
/// round-to-nearest intrinsic so that no compiler setting can contract or reorder them:
/// the results are bitwise equal to the Kokkos back end's (kernels_cuda_test checks it).
/// The square root goes through double like Kokkos' (both are the correctly rounded
/// float square root).
struct AdamwConstants {
  float grad_scale, decay, w, one_minus_w, beta2, one_minus_beta2, neg_step_size, bias2_sqrt, eps;
  bool small_weight;
};

__device__ __forceinline__ void adamw_element(float& p, const float grad, float& m, float& v,
                                              const AdamwConstants& k) {
  const float g = __fmul_rn(grad, k.grad_scale);
  const float pd = __fmul_rn(p, k.decay);
  // ATen's lerp: self + w (end - self) for w < 0.5, else end - (end - self)(1 - w).
  const float m_new = k.small_weight ? __fadd_rn(m, __fmul_rn(k.w, __fsub_rn(g, m)))
                                     : __fsub_rn(g, __fmul_rn(__fsub_rn(g, m), k.one_minus_w));
  const float v_new =
      __fadd_rn(__fmul_rn(v, k.beta2), __fmul_rn(__fmul_rn(k.one_minus_beta2, g), g));
  // IEEE sqrt is correctly rounded: __fsqrt_rn gives the bits of sqrtf (and of the Kokkos
  // kernel's), without a trip through the GPU's slower double unit.
  const float root = __fsqrt_rn(v_new);
  const float denom = __fadd_rn(__fdiv_rn(root, k.bias2_sqrt), k.eps);
  m = m_new;
  v = v_new;
  p = __fadd_rn(pd, __fmul_rn(k.neg_step_size, __fdiv_rn(m_new, denom)));
}

template <bool kVec>
__global__ void adamw_elements(float* params,       // (n)
                               const float* grads,  // (n)
                               float* m,            // (n)
                               float* v,            // (n)
                               const Index n, const AdamwConstants k) {
  for (Index q = grid_start(); q < ceil_div(n, 4); q += grid_stride()) {
    float pv[4], gv[4], mv[4], vv[4];
    load4<kVec>(params, 4 * q, n, pv);
    load4<kVec>(grads, 4 * q, n, gv);
    load4<kVec>(m, 4 * q, n, mv);
    load4<kVec>(v, 4 * q, n, vv);
#pragma unroll
    for (int e = 0; e < 4; ++e)
      adamw_element(pv[e], gv[e], mv[e], vv[e], k);
    store4<kVec>(params, 4 * q, n, pv);
    store4<kVec>(m, 4 * q, n, mv);
    store4<kVec>(v, 4 * q, n, vv);
  }
}

}  // namespace
}  // namespace detail

void run(void* stream, const kernels::detail::AdamwArgs& a) {
  using namespace detail;
  // Host-side constants exactly as the Kokkos back end derives them (float arithmetic).
  AdamwConstants k{};
  k.grad_scale = a.grad_scale;
  k.decay = a.decay;
  k.w = a.lerp_weight;
  k.one_minus_w = 1.0f - a.lerp_weight;
  k.beta2 = a.beta2;
  k.one_minus_beta2 = a.one_minus_beta2;
  k.neg_step_size = -a.step_size;
  k.bias2_sqrt = a.bias2_sqrt;
  k.eps = a.eps;
  k.small_weight = a.lerp_weight < 0.5f;
  const bool vec = aligned16(a.params) && aligned16(a.grads) && aligned16(a.m) && aligned16(a.v);
  with_flag(vec, [&](auto kVec) {
    DST_CUDA_LAUNCH("dst::kernels::adamw_step::elements", adamw_elements<decltype(kVec)::value>,
                    element_grid(ceil_div(a.n, 4)), dim3(kElementThreads), stream_of(stream),
                    a.params, a.grads, a.m, a.v, a.n, k);
  });
}

}  // namespace dst::kernels::cuda_backend
