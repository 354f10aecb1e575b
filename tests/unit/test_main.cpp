// GoogleTest main for unit tests. Invalid floating-point operations trap (SIGFPE), so a
// stray NaN produced by a kernel crashes the test that produced it instead of flowing
// on; tests that create non-finite values on purpose use dst::test::FpTrapDisabled (fp_trap.hpp).
// The host BLAS kernels are chosen as in dstrain itself (blas/host_blas.hpp).
#include <gtest/gtest.h>

#include <cfenv>

#include "blas/host_blas.hpp"

int main(int argc, char** argv) {
  dst::blas::select_host_kernels(argv);  // the kernels dstrain itself runs with
  ::testing::InitGoogleTest(&argc, argv);
  feenableexcept(FE_INVALID);
  return RUN_ALL_TESTS();
}
