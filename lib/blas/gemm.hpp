#pragma once
/// \file gemm.hpp
/// Matrix products, one entry for every back end: host memory goes to CBLAS (OpenBLAS) or,
/// for attention and the dense layers where ExecContext::host_gemm says so, to dstrain's
/// own AVX-512 kernels (own_gemm.hpp); CUDA memory to cuBLAS/cuBLASLt
/// (DSTRAIN_ENABLE_CUDA). Everything is row-major; the column-major vendor calls are
/// reached by swapping operands (C^T = B^T A^T) here, in one place.

#include <cstdint>
#include <string>

#include "tensor/context.hpp"
#include "tensor/tensor.hpp"

namespace dst::blas {

enum class Trans : std::uint8_t { no, yes };

/// C (M, N) = alpha * op(A) (M, K) * op(B) (K, N) + beta * C, row-major f32.
/// lda, ldb, ldc: row strides in elements of A, B, C as stored (A is (M, K) if ta == no,
/// else (K, M)). Throws dst::Error on inconsistent sizes or strides.
void gemm(const tensor::ExecContext& ctx, Trans ta, Trans tb, std::int64_t m, std::int64_t n,
          std::int64_t k, float alpha, const float* a, std::int64_t lda, const float* b,
          std::int64_t ldb, float beta, float* c, std::int64_t ldc);

/// `batch` independent products; matrix i of A, B, C starts at a + i * stride_a, etc.
void gemm_strided_batched(const tensor::ExecContext& ctx, Trans ta, Trans tb, std::int64_t m,
                          std::int64_t n, std::int64_t k, float alpha, const float* a,
                          std::int64_t lda, std::int64_t stride_a, const float* b, std::int64_t ldb,
                          std::int64_t stride_b, float beta, float* c, std::int64_t ldc,
                          std::int64_t stride_c, std::int64_t batch);

/// gemm_strided_batched with alpha = 1 and beta = 0, or beta = 1 when `accumulate`, for
/// products of a few hundred rows and columns at most, such as attention's (one query
/// block of one head). On a host CPU with AVX-512F they run in dstrain's own kernel
/// (own_gemm.hpp, small_gemm: each element one fused multiply-add chain in ascending k, the
/// same bits on every such CPU and build) unless ctx.host_gemm is blas; elsewhere (a GPU,
/// an older CPU) as gemm_strided_batched. The same argument checks and errors as
/// gemm_strided_batched.
void small_gemm_strided_batched(const tensor::ExecContext& ctx, Trans ta, Trans tb, std::int64_t m,
                                std::int64_t n, std::int64_t k, const float* a, std::int64_t lda,
                                std::int64_t stride_a, const float* b, std::int64_t ldb,
                                std::int64_t stride_b, bool accumulate, float* c, std::int64_t ldc,
                                std::int64_t stride_c, std::int64_t batch);

/// The model's dense layers, on tensors whose leading dimensions flatten to rows:
/// y (N, out) = x (N, in) * W^T, W (out, in) as PyTorch's nn.Linear stores it.
/// On the host their products run in dstrain's own kernel (own_gemm.hpp, blocked_gemm)
/// where ctx.host_gemm says so, else in the host BLAS: own, every product (an error without
/// AVX-512F); automatic, on a CPU with AVX-512F while the host BLAS runs one thread, the
/// forward and dx products but not dW (accumulated, where OpenBLAS clears nothing first
/// and measured faster: docs/performance.md).
void linear_forward(const tensor::ExecContext& ctx, const tensor::Tensor& x,
                    const tensor::Tensor& w, const tensor::Tensor& y);
/// dx (N, in) = dy (N, out) * W  (written, or accumulated if accumulate_dx);
/// dW (out, in) += dy^T * x       (always accumulated: gradients sum over micro-batches).
/// Either of dx, dw may be empty (data == nullptr) to skip it.
void linear_backward(const tensor::ExecContext& ctx, const tensor::Tensor& dy,
                     const tensor::Tensor& x, const tensor::Tensor& w, const tensor::Tensor& dx,
                     const tensor::Tensor& dw, bool accumulate_dx = false);

/// Who runs the host's products under ctx, for the start-up log, e.g. "dense layers:
/// dstrain's AVX-512 kernel (forward, input gradients), the host BLAS (weight gradients);
/// attention: dstrain's AVX-512 kernel".
/// Throws dst::Error, as the products themselves would, when ctx.host_gemm is own on a CPU
/// without AVX-512F.
std::string describe_host_products(const tensor::ExecContext& ctx);

}  // namespace dst::blas
