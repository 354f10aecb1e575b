#pragma once
/// \file own_gemm.hpp
/// dstrain's own host SGEMM kernels (AVX-512F), row-major f32: C (M, N) = op(A) op(B) [+ C].
/// Two drivers over the same register tiles:
///  - small_gemm, for attention's products (one sequence and head: a 64-row query block
///    against up to T keys, head_dim wide), where OpenBLAS spends much of each call packing
///    its operands and clearing C;
///  - blocked_gemm, for the model's dense layers (thousands of rows, hundreds to thousands
///    of columns and depth), cache-blocked: op(B) packed once per block into panels that
///    stay in L2, each row tile's op(A) copied to L1, and C written by the first block of k
///    (no separate pass that clears it first, as OpenBLAS makes for beta = 0).
///
/// Arithmetic, the same on every CPU that runs it and in every build: each element of C
/// is one chain of fused multiply-adds in ascending k, acc = (accumulate ? C[i][j] : 0),
/// then acc = fma(op(A)[i][p], op(B)[p][j], acc) for p = 0, 1, ..., K - 1, and
/// C[i][j] = acc. So the result is a scalar loop's, bit for bit (own_gemm_test checks it),
/// whatever the blocking, the compiler flags or the CPU: the kernels are compiled for
/// AVX-512F by a target attribute and chosen at run time. A product split along k into
/// two calls (the second accumulating) gives the same bits as one call over the whole k.
/// docs/performance.md has the measurements ("dstrain's own kernels").

#include <cstdint>

#include "blas/gemm.hpp"

namespace dst::blas {

/// True when this CPU runs the kernels (AVX-512F; false under valgrind, which hides it).
bool own_gemm_supported();

/// C (m, n) = op(A) (m, k) op(B) (k, n), or C += that when `accumulate`; lda, ldb, ldc are
/// the row strides as stored (as gemm()). For products of a few hundred rows and columns
/// at most: tiles of 6 rows x 64 columns, op(B) copied to 64-column panels and A^T to its
/// plain layout once per call. Requires own_gemm_supported(); the caller checks the
/// arguments (gemm.cpp). The copies go to buffers of the calling thread, which grow on
/// first use to the largest product's and are kept: after the first step no call
/// allocates.
void small_gemm(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                std::int64_t lda, const float* b, std::int64_t ldb, bool accumulate, float* c,
                std::int64_t ldc);

/// The same product for any size, cache-blocked for the dense layers: tiles of 12 rows x
/// 32 columns, k in blocks of at most 256, columns in blocks of at most 512; op(B) of each
/// (k, column) block copied once to 32-column panels, and each row tile's op(A) copied
/// once per block, to buffers of the calling thread (grown on first use and kept).
/// Requires own_gemm_supported(); the caller checks the arguments.
void blocked_gemm(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k,
                  const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                  bool accumulate, float* c, std::int64_t ldc);

}  // namespace dst::blas
