// f32 <-> bf16 / f16 conversions for the fused attention path: cuDNN SDPA reads and writes
// 16-bit tensors, the model stores f32. One element per thread-iteration, grid-stride loops;
// memory bound, so the element order does not matter and every result is exact or correctly
// rounded (round to nearest even: the intrinsics' _rn).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/detail/attention_cudnn.hpp"
#include "kernels/cuda/detail/common.cuh"

namespace dst::kernels::cuda_backend::detail {
namespace {

template <bool kF16>
__global__ void narrow_elements(const float* src, std::uint16_t* dst, const Index n) {
  for (Index i = grid_start(); i < n; i += grid_stride()) {
    if constexpr (kF16)
      dst[i] = __half_as_ushort(__float2half_rn(src[i]));
    else
      dst[i] = __bfloat16_as_ushort(__float2bfloat16_rn(src[i]));
  }
}

template <bool kF16>
__global__ void widen_elements(const std::uint16_t* src, float* dst, const Index n) {
  for (Index i = grid_start(); i < n; i += grid_stride()) {
    if constexpr (kF16)
      dst[i] = __half2float(__ushort_as_half(src[i]));
    else
      dst[i] = __bfloat162float(__ushort_as_bfloat16(src[i]));
  }
}

}  // namespace

void to_16bit(cudaStream_t stream, const float* src, std::uint16_t* dst, const std::int64_t n,
              const bool f16) {
  if (n == 0) return;
  with_flag(f16, [&](auto kF16) {
    DST_CUDA_LAUNCH(
        f16 ? "dst::kernels::fused_attention::to_f16" : "dst::kernels::fused_attention::to_bf16",
        narrow_elements<decltype(kF16)::value>, element_grid(n), dim3(kElementThreads), stream, src,
        dst, n);
  });
}

void from_16bit(cudaStream_t stream, const std::uint16_t* src, float* dst, const std::int64_t n,
                const bool f16) {
  if (n == 0) return;
  with_flag(f16, [&](auto kF16) {
    DST_CUDA_LAUNCH(f16 ? "dst::kernels::fused_attention::from_f16"
                        : "dst::kernels::fused_attention::from_bf16",
                    widen_elements<decltype(kF16)::value>, element_grid(n), dim3(kElementThreads),
                    stream, src, dst, n);
  });
}

}  // namespace dst::kernels::cuda_backend::detail
