// The host BLAS kernel choice (blas/host_blas.hpp). This test program's main called
// select_host_kernels() as dstrain's does, so what it reports is what dstrain runs with.
#include "blas/host_blas.hpp"

#include <gtest/gtest.h>

#include <cstdlib>

namespace dst::blas {
namespace {

TEST(HostBlas, KernelsUseTheVectorUnitsTheCpuHas) {
  const HostBlas b = host_blas();
  ASSERT_FALSE(b.kernels.empty()) << "not OpenBLAS: " << b.config;
  EXPECT_NE(b.config.find("OpenBLAS"), std::string::npos) << b.config;
  if (std::getenv("OPENBLAS_CORETYPE") && b.detected.empty())
    GTEST_SKIP() << "OPENBLAS_CORETYPE is set outside dstrain: its choice (" << b.kernels
                 << ") is kept on purpose";
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    EXPECT_FALSE(pre_avx2_family(b.kernels))
        << b.describe() << ": OpenBLAS runs kernels without AVX2 on an AVX2 CPU";
  }
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
      !b.detected.empty()) {
    EXPECT_EQ(b.kernels, "SkylakeX") << b.describe();
  }
#endif
  if (!b.detected.empty()) {
    // dstrain overrode the library: it says so, and what the library had chosen.
    EXPECT_TRUE(pre_avx2_family(b.detected)) << b.detected;
    EXPECT_NE(b.describe().find("chosen by dstrain: OpenBLAS detected " + b.detected),
              std::string::npos)
        << b.describe();
  }
}

TEST(HostBlas, PreAvx2FamiliesAreTheFallbacksOnly) {
  EXPECT_TRUE(pre_avx2_family("Prescott"));
  EXPECT_TRUE(pre_avx2_family("Sandybridge"));
  EXPECT_FALSE(pre_avx2_family("Haswell"));
  EXPECT_FALSE(pre_avx2_family("SkylakeX"));
  EXPECT_FALSE(pre_avx2_family("Cooperlake"));
  EXPECT_FALSE(pre_avx2_family("Zen"));
  EXPECT_FALSE(pre_avx2_family(""));
}

}  // namespace
}  // namespace dst::blas
