#pragma once
/// \file context.hpp
/// Where and how a kernel or matrix product runs. Passed explicitly to every kernel and
/// BLAS call (never a global), so the model never knows which back end runs it.

#include <cstdint>
#include <string_view>

namespace dst::tensor {

enum class Backend : std::uint8_t {
  kokkos,  ///< portable Kokkos kernels (the reference); host BLAS for matrix products
  cuda,    ///< native CUDA kernels; cuBLAS/cuBLASLt (DSTRAIN_ENABLE_CUDA builds)
};

constexpr std::string_view backend_name(Backend b) {
  return b == Backend::cuda ? "cuda" : "kokkos";
}

struct ExecContext {
  Backend backend = Backend::kokkos;
  void* stream = nullptr;  ///< cudaStream_t on the CUDA back end; unused by Kokkos Serial
};

}  // namespace dst::tensor
