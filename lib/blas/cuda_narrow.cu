/// \file cuda_narrow.cu
/// fp32 -> bf16 / f16 for the operands of cuBLASLt's 16-bit products (cuda_narrow.hpp).
/// Each value is rounded to nearest even by the conversion intrinsics (_rn), so a value
/// that already is a bf16 (f16) value converts exactly. Grid-stride loops over groups of
/// four: one 16-byte load and one 8-byte store per group when the pointers are aligned for
/// them, a scalar loop otherwise and for the tail.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "blas/detail/cuda_narrow.hpp"
#include "core/error.hpp"

namespace dst::blas::detail {
namespace {

constexpr int kThreads = 256;
constexpr std::int64_t kMaxBlocks = 4096;

template <bool kF16>
__device__ __forceinline__ std::uint16_t narrow_one(const float x) {
  if constexpr (kF16)
    return __half_as_ushort(__float2half_rn(x));
  else
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

template <bool kF16>
__global__ void narrow_vec4(const float4* src, uint2* dst, const std::int64_t groups) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < groups; i += stride) {
    const float4 v = src[i];
    const std::uint32_t lo = narrow_one<kF16>(v.x) | (std::uint32_t{narrow_one<kF16>(v.y)} << 16);
    const std::uint32_t hi = narrow_one<kF16>(v.z) | (std::uint32_t{narrow_one<kF16>(v.w)} << 16);
    dst[i] = make_uint2(lo, hi);
  }
}

template <bool kF16>
__global__ void narrow_scalar(const float* src, std::uint16_t* dst, const std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    dst[i] = narrow_one<kF16>(src[i]);
}

dim3 grid_for(const std::int64_t work) {
  return dim3(static_cast<unsigned>(std::max<std::int64_t>(
      1, std::min<std::int64_t>((work + kThreads - 1) / kThreads, kMaxBlocks))));
}

void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throw Error(std::string("blas: launching ") + what + " failed: " + cudaGetErrorString(e));
}

template <bool kF16>
void narrow(cudaStream_t s, const float* src, std::uint16_t* dst, const std::int64_t n) {
  const bool vec = reinterpret_cast<std::uintptr_t>(src) % 16 == 0 &&
                   reinterpret_cast<std::uintptr_t>(dst) % 8 == 0;
  const std::int64_t groups = vec ? n / 4 : 0;
  if (groups > 0) {
    narrow_vec4<kF16><<<grid_for(groups), kThreads, 0, s>>>(reinterpret_cast<const float4*>(src),
                                                            reinterpret_cast<uint2*>(dst), groups);
    check_launch("the fp32 -> 16-bit operand conversion (vectorised)");
  }
  const std::int64_t done = groups * 4;
  if (done < n) {
    narrow_scalar<kF16><<<grid_for(n - done), kThreads, 0, s>>>(src + done, dst + done, n - done);
    check_launch("the fp32 -> 16-bit operand conversion");
  }
}

}  // namespace

void narrow_to_16bit(void* stream, const float* src, std::uint16_t* dst, const std::int64_t n,
                     const bool f16) {
  if (n <= 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  if (f16)
    narrow<true>(s, src, dst, n);
  else
    narrow<false>(s, src, dst, n);
}

}  // namespace dst::blas::detail
