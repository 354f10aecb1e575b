#pragma once
/// \file cuda_narrow.hpp
/// Internal (CUDA builds): fp32 to 16-bit conversion of matrix-product operands, so that
/// cuBLASLt multiplies 16-bit inputs at the tensor cores' full rate (cublaslt_gemm.cpp).

#include <cstdint>

namespace dst::blas::detail {

/// dst[i] = src[i] rounded to nearest even, as bf16 (or IEEE half when `f16`), for
/// i in [0, n), enqueued on `stream` (a cudaStream_t). Memory bound; vectorised (four
/// elements per access) where both pointers allow it.
void narrow_to_16bit(void* stream, const float* src, std::uint16_t* dst, std::int64_t n, bool f16);

}  // namespace dst::blas::detail
