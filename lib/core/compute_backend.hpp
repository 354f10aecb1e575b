#pragma once
/// \file compute_backend.hpp
/// Which kernels run the model. Defined here, below every layer, because the runtime
/// resolves it from the deck and the device (runtime::resolve_backends) and the tensor
/// layer carries it in every ExecContext (as tensor::Backend).

#include <array>
#include <cstdint>

#include "core/enum_names.hpp"

namespace dst {

enum class ComputeBackend : std::uint8_t {
  kokkos,  ///< portable Kokkos kernels (the reference); host BLAS for matrix products
  cuda,    ///< native CUDA kernels; cuBLAS/cuBLASLt (DSTRAIN_ENABLE_CUDA builds)
};

template <>
struct EnumNames<ComputeBackend> {
  static constexpr std::array<const char*, 2> names{"kokkos", "cuda"};
};

}  // namespace dst
