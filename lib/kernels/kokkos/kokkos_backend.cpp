// Back-end queries that need Kokkos but belong to no kernel.
#include "kernels/kokkos/kokkos_backend.hpp"

#include <Kokkos_Core.hpp>

namespace dst::kernels::kokkos_backend {

bool initialized() {
  return Kokkos::is_initialized();
}

tensor::Device device() {
  using MemorySpace = Kokkos::DefaultExecutionSpace::memory_space;
  return Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemorySpace>::accessible
             ? tensor::Device::host
             : tensor::Device::cuda;
}

}  // namespace dst::kernels::kokkos_backend
