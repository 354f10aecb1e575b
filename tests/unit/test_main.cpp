// GoogleTest main for unit tests. Invalid floating-point operations trap (SIGFPE), so a
// stray NaN produced by a kernel crashes the test that produced it instead of flowing
// on; tests that create non-finite values on purpose use dst::test::FpTrapDisabled (fp_trap.hpp).
#include <gtest/gtest.h>

#include <cfenv>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  feenableexcept(FE_INVALID);
  return RUN_ALL_TESTS();
}
