#pragma once
/// \file cublaslt_gemm.hpp
/// Internal: the cuBLASLt back end of gemm.hpp, compiled only in CUDA builds
/// (DSTRAIN_HAVE_CUDA). Arguments arrive validated by gemm.cpp and in gemm.hpp's
/// row-major convention; the operand swap to column-major happens inside, in one place.

#include <cstddef>
#include <cstdint>

#include "blas/gemm.hpp"
#include "core/dtype.hpp"

namespace dst::blas::detail {

/// Device workspace given to cuBLASLt, allocated once per (thread, device) handle. The
/// cuBLAS API reference (cublasSetWorkspace) recommends 32 MiB on Hopper and 4 MiB on
/// earlier GPUs; 32 MiB serves both.
inline constexpr std::size_t kCublasLtWorkspaceBytes = std::size_t{32} << 20;

/// Row-major C (M, N) = alpha op(A) op(B) + beta C on `stream` (a cudaStream_t), with the
/// inputs multiplied in `math` (f32: true fp32 products; bf16 / f16: tensor cores with fp32
/// accumulation, exact on operands that already hold bf16 / f16 values). M, N >= 1.
void cublaslt_gemm(void* stream, DType math, Trans ta, Trans tb, std::int64_t m, std::int64_t n,
                   std::int64_t k, float alpha, const float* a, std::int64_t lda, const float* b,
                   std::int64_t ldb, float beta, float* c, std::int64_t ldc);

/// The strided-batched form of cublaslt_gemm (batch >= 1).
void cublaslt_gemm_strided_batched(void* stream, DType math, Trans ta, Trans tb, std::int64_t m,
                                   std::int64_t n, std::int64_t k, float alpha, const float* a,
                                   std::int64_t lda, std::int64_t stride_a, const float* b,
                                   std::int64_t ldb, std::int64_t stride_b, float beta, float* c,
                                   std::int64_t ldc, std::int64_t stride_c, std::int64_t batch);

/// For tests: the number of cached plans (shape -> layouts + algorithm) of the calling
/// thread's handle on the current device, 0 before its first product there.
std::size_t cublaslt_cache_size();

/// For tests: how many times the calling thread has asked cuBLASLt's heuristic for an
/// algorithm on the current device (once per new plan; a cached shape asks none).
std::uint64_t cublaslt_heuristic_queries();

}  // namespace dst::blas::detail
