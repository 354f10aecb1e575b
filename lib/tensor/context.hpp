#pragma once
/// \file context.hpp
/// Where and how a kernel or matrix product runs. Passed explicitly to every kernel and
/// BLAS call (never a global), so the model never knows which back end runs it.

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/compute_backend.hpp"
#include "core/dtype.hpp"

namespace dst::tensor {

/// kokkos or cuda (core/compute_backend.hpp, where the runtime resolves it too).
using Backend = ComputeBackend;

constexpr std::string_view backend_name(Backend b) {
  return EnumNames<Backend>::names[static_cast<std::size_t>(b)];
}

/// Who runs the host's matrix products (kernels.host_gemm): the host BLAS (OpenBLAS), or
/// dstrain's own AVX-512 kernels (blas/own_gemm.hpp). Ignored on the CUDA back end.
enum class HostGemm : std::uint8_t {
  automatic,  ///< dstrain's kernels where the CPU has AVX-512F: attention's products, and the
              ///< dense layers' forward and input-gradient products while the host BLAS runs
              ///< one thread; the weight gradients in the BLAS
  blas,       ///< every host product in the BLAS
  own,        ///< dstrain's kernels for every product they serve (needs AVX-512F)
};

struct ExecContext {
  Backend backend = Backend::kokkos;
  void* stream = nullptr;  ///< cudaStream_t on the CUDA back end; unused by Kokkos Serial
  /// The precision the inputs of matrix products are multiplied in, with fp32 accumulation
  /// and fp32 storage either way (training.precision, docs/precision.md): f32, or bf16 /
  /// f16, whose operands hold values the model has already rounded to that type. The
  /// host BLAS multiplies in fp32 whatever this says (exact on such operands); cuBLASLt
  /// uses tensor cores in bf16 / f16 with fp32 accumulation (CUBLAS_COMPUTE_32F_FAST_16BF
  /// / _16F), and true fp32 products for f32.
  DType math = DType::f32;
  HostGemm host_gemm = HostGemm::automatic;
};

}  // namespace dst::tensor
