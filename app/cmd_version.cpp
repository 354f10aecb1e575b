#include <cstdio>

#include "blas/host_blas.hpp"
#include "commands.hpp"
#include "core/version.hpp"
#include "runtime/runtime.hpp"

namespace dst::app {

int run_version() {
  std::printf("dstrain %s (git %s)\n", core::version().c_str(), core::git_hash().c_str());
  for (const auto& [name, version] : runtime::library_versions())
    std::printf("  %-10s %s\n", name.c_str(), version.c_str());
  std::printf("  %-10s %s\n", "yaml-cpp", core::yaml_cpp_version().c_str());
  std::printf("  %-10s %s\n", "OpenBLAS", blas::host_blas().describe().c_str());
  std::printf("  %-10s %s\n", "back ends",
              core::built_with_cuda() ? (core::built_with_nccl() ? "kokkos, cuda; comm mpi, nccl"
                                                                 : "kokkos, cuda; comm mpi")
                                      : "kokkos; comm mpi");
  return 0;
}

}  // namespace dst::app
