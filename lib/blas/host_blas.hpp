#pragma once
/// \file host_blas.hpp
/// Which kernels the host BLAS (OpenBLAS) runs, and dstrain's correction of its choice on
/// CPUs newer than the library.
///
/// OpenBLAS built with DYNAMIC_ARCH (every distribution package) picks its kernel family
/// when it is loaded, from the CPU's family and model numbers. A release older than the
/// CPU does not know the model and falls back to its SSE3 ("Prescott") kernels: Debian
/// 12's OpenBLAS 0.3.21 on Sapphire/Emerald Rapids runs SGEMM at about 32 GFLOP/s per
/// core where its own AVX-512 ("SkylakeX") kernels reach about 150 (docs/performance.md).
/// The library's override, OPENBLAS_CORETYPE, is read only while it loads, i.e. before
/// main, so a program can only set it and start again.

#include <string>
#include <string_view>

namespace dst::blas {

/// What runs matrix products on the host.
struct HostBlas {
  std::string config;    ///< openblas_get_config(), or "unknown CBLAS" for another library
  std::string kernels;   ///< kernel family in use (openblas_get_corename()), or ""
  std::string detected;  ///< the library's own choice when dstrain overrode it, else ""
  /// One line for logs and --version: "OpenBLAS 0.3.21 ... (SkylakeX kernels; ...)".
  std::string describe() const;
};

HostBlas host_blas();

/// The threads the host BLAS computes a product with (openblas_get_num_threads), or 0 when
/// the library does not say (another CBLAS).
int host_blas_threads();

/// True for the OpenBLAS kernel families (openblas_get_corename() names) that use neither
/// AVX2 nor AVX-512: what a DYNAMIC_ARCH build falls back to on a model it does not know.
bool pre_avx2_family(std::string_view kernels);

/// Call first in main() of every dstrain program, before MPI, threads or anything else:
/// when OPENBLAS_CORETYPE is not set, the loaded OpenBLAS chose a kernel family without
/// AVX2, and the CPU has AVX-512 (F, BW, DQ, VL) or AVX2 with FMA, this sets
/// OPENBLAS_CORETYPE to SkylakeX or Haswell and re-executes the program (execv of
/// /proc/self/exe with the same arguments: same process id and environment otherwise,
/// so mpirun, srun and an MPI singleton see nothing). A user or site that sets
/// OPENBLAS_CORETYPE, to any value, keeps its choice; under valgrind nothing changes (the
/// new program would run outside the tool). Returns when there is nothing to do,
/// after the re-execution (the second run finds the mark it left), or when execv fails.
void select_host_kernels(char** argv);

}  // namespace dst::blas
