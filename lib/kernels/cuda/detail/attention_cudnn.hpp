#pragma once
/// \file attention_cudnn.hpp
/// What the fused attention host code (cuda/attention_cudnn.cpp) needs from device code
/// (cuda/convert.cu): the conversions between the f32 storage of the model and the 16-bit
/// tensors cuDNN reads and writes. 16-bit values travel as their bits (std::uint16_t), so
/// the host code includes no cuda_bf16.h / cuda_fp16.h. Internal to kernels/cuda/.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dst::kernels::cuda_backend::detail {

/// dst[i] = bits of src[i] rounded to nearest even in bf16 (f16 when `f16`; |x| >= 65520
/// becomes +-inf there, as core/bf16.hpp's f16), i < n. Exact for values already rounded to
/// that type. Enqueued on `stream`; dst 2-byte aligned.
void to_16bit(cudaStream_t stream, const float* src, std::uint16_t* dst, std::int64_t n, bool f16);

/// dst[i] = the bf16 (f16 when `f16`) value with bits src[i], widened to f32 (exact).
void from_16bit(cudaStream_t stream, const std::uint16_t* src, float* dst, std::int64_t n,
                bool f16);

}  // namespace dst::kernels::cuda_backend::detail
