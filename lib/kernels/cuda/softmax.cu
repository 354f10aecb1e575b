// Causal softmax over attention scores viewed as rows (b, h, i) of length T: row i keeps
// columns j <= i and is exactly 0 beyond. A row group per row (warp shuffles, then the
// group's warps in order), the Kokkos kernels' passes and float/double choices.
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/detail/common.cuh"

namespace dst::kernels::cuda_backend {
namespace detail {
namespace {

/// Max of the scaled live scores, then p = exp(scale * s - max) stored and summed in
/// double, then p *= 1 / sum; zeros for j > i. The masked scores may hold anything: a quad
/// that straddles the diagonal loads them, but no result depends on them. probs may alias
/// scores: every element is read and written by the thread owning its quad, and the max
/// is complete (a group barrier) before the first write.
template <int kGroup, bool kVec>
__global__ void __launch_bounds__(RowGroup<kGroup>::kBlock)
    forward_rows(const float* scores,  // (B*H*T, T)
                 const float scale,
                 float* probs,  // (B*H*T, T)
                 const Index rows, const Index t_len) {
  using G = RowGroup<kGroup>;
  __shared__ double partial[G::kWarpsPerBlock];
  __shared__ float partial_max[G::kWarpsPerBlock];
  const Index row = G::row();
  const bool active = row < rows;
  const Index live = active ? row % t_len + 1 : 0;  // columns j <= i
  const Index live_quads = ceil_div(live, 4);
  const Index base = (active ? row : 0) * t_len;
  const float* s = scores + base;
  float* p = probs + base;

  float m = math::negative_infinity();
  for (Index q = G::rank(); q < live_quads; q += kGroup) {
    float v[4];
    load4<kVec>(s, 4 * q, t_len, v);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float x = scale * v[k];
      if (4 * q + k < live) m = x > m ? x : m;
    }
  }
  m = G::max(m, partial_max);

  double sum = 0.0;
  for (Index q = G::rank(); q < live_quads; q += kGroup) {
    float v[4];
    load4<kVec>(s, 4 * q, t_len, v);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v[k] = 4 * q + k < live ? math::fast_exp(scale * v[k] - m) : 0.0f;
      sum += static_cast<double>(v[k]);  // masked: + 0, exact
    }
    store4<kVec>(p, 4 * q, t_len, v);
  }
  sum = G::sum(sum, partial);
  if (!active) return;
  // sum >= 1 (the max's own term is exp(0)), so the reciprocal is safe.
  const float inv = static_cast<float>(1.0 / sum);
  const Index quads = ceil_div(t_len, 4);
  for (Index q = G::rank(); q < quads; q += kGroup) {
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (q < live_quads) {
      load4<kVec>(p, 4 * q, t_len, v);  // this thread's own stores of the pass above
#pragma unroll
      for (int k = 0; k < 4; ++k)
        v[k] = 4 * q + k < live ? v[k] * inv : 0.0f;
    }
    store4<kVec>(p, 4 * q, t_len, v);
  }
}

/// dscores = scale * p * (dp - sum_j p * dp), 0 above the diagonal. dscores may alias
/// dprobs: the dot product is complete (a group barrier) before the first write, and each
/// element is read and written by the same thread.
template <int kGroup, bool kVec>
__global__ void __launch_bounds__(RowGroup<kGroup>::kBlock)
    backward_rows(const float* probs,   // (B*H*T, T)
                  const float* dprobs,  // (B*H*T, T)
                  const float scale,
                  float* dscores,  // (B*H*T, T)
                  const Index rows, const Index t_len) {
  using G = RowGroup<kGroup>;
  __shared__ double partial[G::kWarpsPerBlock];
  const Index row = G::row();
  const bool active = row < rows;
  const Index live = active ? row % t_len + 1 : 0;
  const Index live_quads = ceil_div(live, 4);
  const Index base = (active ? row : 0) * t_len;
  const float* p = probs + base;
  const float* dp = dprobs + base;
  float* ds = dscores + base;

  double dot = 0.0;
  for (Index q = G::rank(); q < live_quads; q += kGroup) {
    float pv[4], dv[4];
    load4<kVec>(p, 4 * q, t_len, pv);
    load4<kVec>(dp, 4 * q, t_len, dv);
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (4 * q + k < live) dot += static_cast<double>(pv[k] * dv[k]);
  }
  const float d = static_cast<float>(G::sum(dot, partial));
  if (!active) return;
  const Index quads = ceil_div(t_len, 4);
  for (Index q = G::rank(); q < quads; q += kGroup) {
    float out[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (q < live_quads) {
      float pv[4], dv[4];
      load4<kVec>(p, 4 * q, t_len, pv);
      load4<kVec>(dp, 4 * q, t_len, dv);
#pragma unroll
      for (int k = 0; k < 4; ++k)
        out[k] = 4 * q + k < live ? scale * pv[k] * (dv[k] - d) : 0.0f;
    }
    store4<kVec>(ds, 4 * q, t_len, out);
  }
}

}  // namespace
}  // namespace detail

void run(void* stream, const kernels::detail::SoftmaxForwardArgs& a) {
  using namespace detail;
  const cudaStream_t s = stream_of(stream);
  const bool vec = a.t % 4 == 0 && aligned16(a.scores) && aligned16(a.probs);
  with_group(group_for(a.t), [&](auto group) {
    constexpr int kGroup = decltype(group)::value;
    with_flag(vec, [&](auto kVec) {
      DST_CUDA_LAUNCH("dst::kernels::causal_softmax_forward::rows",
                      forward_rows<kGroup, decltype(kVec)::value>,
                      row_grid<kGroup>(a.rows, "causal_softmax_forward"),
                      dim3(RowGroup<kGroup>::kBlock), s, a.scores, a.scale, a.probs, a.rows, a.t);
    });
  });
}

void run(void* stream, const kernels::detail::SoftmaxBackwardArgs& a) {
  using namespace detail;
  const cudaStream_t s = stream_of(stream);
  const bool vec =
      a.t % 4 == 0 && aligned16(a.probs) && aligned16(a.dprobs) && aligned16(a.dscores);
  with_group(group_for(a.t), [&](auto group) {
    constexpr int kGroup = decltype(group)::value;
    with_flag(vec, [&](auto kVec) {
      DST_CUDA_LAUNCH("dst::kernels::causal_softmax_backward::rows",
                      backward_rows<kGroup, decltype(kVec)::value>,
                      row_grid<kGroup>(a.rows, "causal_softmax_backward"),
                      dim3(RowGroup<kGroup>::kBlock), s, a.probs, a.dprobs, a.scale, a.dscores,
                      a.rows, a.t);
    });
  });
}

}  // namespace dst::kernels::cuda_backend
