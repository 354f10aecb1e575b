/// \file host_blas.cpp
/// OpenBLAS kernel selection (host_blas.hpp). The OpenBLAS extension functions are
/// declared weak, so a build against another CBLAS links and simply reports less.
#include "blas/host_blas.hpp"

#include <unistd.h>

#include <array>
#include <cstdlib>
#include <string_view>

extern "C" {
char* openblas_get_config(void) __attribute__((weak));
char* openblas_get_corename(void) __attribute__((weak));
int openblas_get_num_threads(void) __attribute__((weak));
}

namespace dst::blas {
namespace {

// Set in the re-executed program: "<family OpenBLAS chose>". Also stops a second
// re-execution if the override had no effect (a build without DYNAMIC_ARCH).
constexpr const char* kMark = "DSTRAIN_OPENBLAS_DETECTED";

// The best OpenBLAS 0.3.x family this CPU can run, by instruction set, or nullptr.
const char* best_family() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return nullptr;
}

// Under valgrind an exec would leave the tool (it follows only with --trace-children).
bool under_valgrind() {
  const char* preload = std::getenv("LD_PRELOAD");
  return preload && std::string_view(preload).find("vgpreload") != std::string_view::npos;
}

}  // namespace

bool pre_avx2_family(std::string_view core) {
  constexpr std::array<std::string_view, 21> kOld{
      "Prescott",    "Core2",        "Penryn",     "Dunnington", "Nehalem",   "Sandybridge",
      "Atom",        "Katmai",       "Coppermine", "Northwood",  "Banias",    "Athlon",
      "Opteron",     "Opteron_SSE3", "Barcelona",  "Bobcat",     "Bulldozer", "Piledriver",
      "Steamroller", "Excavator",    "Nano"};
  for (const auto& name : kOld)
    if (core == name) return true;
  return false;
}

std::string HostBlas::describe() const {
  std::string s = config;
  if (!kernels.empty()) {
    s += " (" + kernels + " kernels";
    if (!detected.empty() && detected != kernels)
      s += "; chosen by dstrain: OpenBLAS detected " + detected +
           " on this CPU; set OPENBLAS_CORETYPE to override";
    else if (!detected.empty())
      s += "; dstrain's OPENBLAS_CORETYPE had no effect: this OpenBLAS has no DYNAMIC_ARCH";
    s += ")";
  }
  return s;
}

int host_blas_threads() {
  return openblas_get_num_threads ? openblas_get_num_threads() : 0;
}

HostBlas host_blas() {
  HostBlas b;
  b.config = openblas_get_config ? openblas_get_config() : "unknown CBLAS (not OpenBLAS)";
  if (openblas_get_corename) b.kernels = openblas_get_corename();
  if (const char* d = std::getenv(kMark)) b.detected = d;
  return b;
}

void select_host_kernels(char** argv) {
  if (!openblas_get_corename || std::getenv("OPENBLAS_CORETYPE") || std::getenv(kMark) ||
      under_valgrind())
    return;
  const std::string core = openblas_get_corename();
  const char* best = best_family();
  if (!best || !pre_avx2_family(core)) return;
  if (setenv("OPENBLAS_CORETYPE", best, 1) != 0 || setenv(kMark, core.c_str(), 1) != 0) return;
  // The binary's own path where it can be read: the kernel names a process after the
  // file it executes, and "/proc/self/exe" would make every rank an "exe" in ps, top and
  // pkill (and hide it from the CPU-sharing check, runtime/cpu_binding.hpp).
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) {
    self[n] = '\0';
    if (access(self, X_OK) == 0) execv(self, argv);  // not if replaced: " (deleted)"
  }
  execv("/proc/self/exe", argv);
  // execv failed (no /proc, say): go on with the library's choice, and say nothing
  // chose otherwise.
  unsetenv("OPENBLAS_CORETYPE");
  unsetenv(kMark);
}

}  // namespace dst::blas
