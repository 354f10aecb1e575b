#pragma once
/// \file cublas_gemm.hpp
/// Internal: the cuBLAS back end of gemm.hpp, compiled only in CUDA builds
/// (DSTRAIN_HAVE_CUDA). Arguments arrive validated by gemm.cpp and in gemm.hpp's
/// row-major convention; the operand swap to column-major happens inside.

#include <cstdint>

#include "blas/gemm.hpp"

namespace dst::blas::detail {

/// Row-major C (M, N) = alpha op(A) op(B) + beta C on `stream` (a cudaStream_t).
void cublas_gemm(void* stream, Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k,
                 float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                 float beta, float* c, std::int64_t ldc);

/// The strided-batched form of cublas_gemm.
void cublas_gemm_strided_batched(void* stream, Trans ta, Trans tb, std::int64_t m, std::int64_t n,
                                 std::int64_t k, float alpha, const float* a, std::int64_t lda,
                                 std::int64_t stride_a, const float* b, std::int64_t ldb,
                                 std::int64_t stride_b, float beta, float* c, std::int64_t ldc,
                                 std::int64_t stride_c, std::int64_t batch);

}  // namespace dst::blas::detail
