/// \file cublas_gemm.cpp
/// cuBLAS back end of gemm.hpp (CUDA builds only). Host code: it only enqueues cuBLAS
/// calls on the context's stream, so it is compiled by the C++ compiler, not nvcc.
///
/// Numerics: every handle is pinned to CUBLAS_DEFAULT_MATH, which for SGEMM means true
/// fp32 (TF32 tensor cores need CUBLAS_TF32_TENSOR_OP_MATH, which we never set), and to
/// CUBLAS_ATOMICS_NOT_ALLOWED. That keeps the CUDA back end within fp32 rounding of the
/// host reference (the parity tests' tolerances assume fp32 products, TF32's 10-bit
/// mantissa would break them) and bitwise run-to-run reproducible on one GPU model and
/// toolkit (cuBLAS "Results reproducibility"; with several streams per handle cuBLAS also
/// asks for CUBLAS_WORKSPACE_CONFIG=:4096:8, which the launcher may set).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "blas/detail/cublas_gemm.hpp"
#include "core/error.hpp"

/// Throws dst::Error naming the cuBLAS status, the call and file:line unless `call`
/// returns CUBLAS_STATUS_SUCCESS.
#define DST_CUBLAS_CHECK(call)                                                                    \
  do {                                                                                            \
    const cublasStatus_t dst_cublas_status_ = (call);                                             \
    if (dst_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                              \
      throw ::dst::Error(std::string("blas: ") + cublasGetStatusName(dst_cublas_status_) + " (" + \
                         cublasGetStatusString(dst_cublas_status_) + ") from " + #call + " [" +   \
                         __FILE__ + ":" + std::to_string(__LINE__) + "]");                        \
  } while (0)

/// The same for CUDA runtime calls.
#define DST_CUDA_CHECK(call)                                                                 \
  do {                                                                                       \
    const cudaError_t dst_cuda_status_ = (call);                                             \
    if (dst_cuda_status_ != cudaSuccess)                                                     \
      throw ::dst::Error(std::string("blas: ") + cudaGetErrorName(dst_cuda_status_) + " (" + \
                         cudaGetErrorString(dst_cuda_status_) + ") from " + #call + " [" +   \
                         __FILE__ + ":" + std::to_string(__LINE__) + "]");                   \
  } while (0)

namespace dst::blas::detail {

namespace {

/// One cuBLAS handle per (thread, device): a handle is not safe to share between threads
/// that change its stream, and it belongs to the device current when it was created.
/// Handles are created on first use and destroyed when the thread ends.
class HandleCache {
 public:
  HandleCache() = default;
  HandleCache(const HandleCache&) = delete;
  HandleCache& operator=(const HandleCache&) = delete;
  ~HandleCache() {
    // At process exit the CUDA context may already be gone; nothing useful can be done
    // with a failed destroy then, so its status is ignored.
    for (auto& e : entries_)
      cublasDestroy(e.handle);
  }

  /// The calling thread's handle for the current device, bound to `stream`.
  cublasHandle_t get(cudaStream_t stream) {
    int device = 0;
    DST_CUDA_CHECK(cudaGetDevice(&device));
    Entry* e = nullptr;
    for (auto& x : entries_)
      if (x.device == device) e = &x;
    if (e == nullptr) e = &create(device);
    if (e->stream != stream) {
      DST_CUBLAS_CHECK(cublasSetStream(e->handle, stream));
      e->stream = stream;
    }
    return e->handle;
  }

 private:
  struct Entry {
    int device;
    cublasHandle_t handle;
    cudaStream_t stream;
  };

  Entry& create(int device) {
    cublasHandle_t h = nullptr;
    DST_CUBLAS_CHECK(cublasCreate(&h));
    try {
      DST_CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
      DST_CUBLAS_CHECK(cublasSetAtomicsMode(h, CUBLAS_ATOMICS_NOT_ALLOWED));
      DST_CUBLAS_CHECK(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST));  // alpha, beta
      // A fresh handle runs on the legacy default stream; bind it explicitly below.
      DST_CUBLAS_CHECK(cublasSetStream(h, nullptr));
    } catch (...) {
      cublasDestroy(h);
      throw;
    }
    entries_.push_back(Entry{device, h, nullptr});
    return entries_.back();
  }

  std::vector<Entry> entries_;
};

cublasHandle_t handle_for(void* stream) {
  thread_local HandleCache cache;
  return cache.get(static_cast<cudaStream_t>(stream));
}

cublasOperation_t op(Trans t) {
  return t == Trans::no ? CUBLAS_OP_N : CUBLAS_OP_T;
}

}  // namespace

// Row-major C (M, N) is column-major C^T (N, M) with the same ldc, and likewise for A and
// B, so C^T = op(B)^T op(A)^T is one column-major product with the operands swapped:
// (transa, transb) = (tb, ta), (m, n) = (N, M), A' = B (ldb), B' = A (lda).
void cublas_gemm(void* stream, Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k,
                 float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                 float beta, float* c, std::int64_t ldc) {
  cublasHandle_t h = handle_for(stream);
  // The _64 entries (cuBLAS 12+) take the int64 sizes of gemm.hpp without narrowing;
  // cuBLAS wants ld >= max(1, rows) column-major, checked as ld >= row length by gemm.cpp.
  DST_CUBLAS_CHECK(cublasSgemm_64(h, op(tb), op(ta), n, m, k, &alpha, b, ldb > 0 ? ldb : 1, a,
                                  lda > 0 ? lda : 1, &beta, c, ldc > 0 ? ldc : 1));
}

void cublas_gemm_strided_batched(void* stream, Trans ta, Trans tb, std::int64_t m, std::int64_t n,
                                 std::int64_t k, float alpha, const float* a, std::int64_t lda,
                                 std::int64_t stride_a, const float* b, std::int64_t ldb,
                                 std::int64_t stride_b, float beta, float* c, std::int64_t ldc,
                                 std::int64_t stride_c, std::int64_t batch) {
  cublasHandle_t h = handle_for(stream);
  DST_CUBLAS_CHECK(cublasSgemmStridedBatched_64(
      h, op(tb), op(ta), n, m, k, &alpha, b, ldb > 0 ? ldb : 1, stride_b, a, lda > 0 ? lda : 1,
      stride_a, &beta, c, ldc > 0 ? ldc : 1, stride_c, batch));
}

}  // namespace dst::blas::detail
