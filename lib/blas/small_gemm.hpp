#pragma once
/// \file small_gemm.hpp
/// dstrain's own host kernel for the small products of attention (one sequence and head:
/// a 64-row query block against up to T keys, head_dim wide), where OpenBLAS spends much
/// of each call packing its operands: C (M, N) = op(A) op(B) [+ C], row-major f32.
///
/// Arithmetic, the same on every CPU that runs it: each element of C is one chain of
/// fused multiply-adds in ascending k, acc = (accumulate ? C[i][j] : 0), then
/// acc = fma(op(A)[i][p], op(B)[p][j], acc) for p = 0, 1, ..., K - 1, and C[i][j] = acc.
/// So the result is a scalar loop's, bit for bit (small_gemm_test checks it), whatever the
/// compiler flags of the build: the kernel is compiled for AVX-512F by a target attribute
/// and chosen at run time. The layer products stay with OpenBLAS, which is faster at their
/// sizes (docs/performance.md, "dstrain's own kernel for the attention products").

#include <cstdint>

#include "blas/gemm.hpp"

namespace dst::blas {

/// True when this CPU runs the kernel (AVX-512F; false under valgrind, which hides it).
bool small_gemm_supported();

/// C (m, n) = op(A) (m, k) op(B) (k, n), or C += that when `accumulate`; lda, ldb, ldc are
/// the row strides as stored (as gemm()). Requires small_gemm_supported(); the caller
/// checks the arguments (gemm.cpp). Copies of op(B), and of A^T when ta == yes, go to two
/// buffers of the calling thread, which grow on first use to the largest product's and
/// are kept: after the first step no call allocates.
void small_gemm(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                std::int64_t lda, const float* b, std::int64_t ldb, bool accumulate, float* c,
                std::int64_t ldc);

}  // namespace dst::blas
