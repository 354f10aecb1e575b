#pragma once
// Tests run with the FE_INVALID trap on (tests/unit/test_main.cpp) so a stray NaN crashes
// the test that made it. Tests that create non-finite values on purpose hold one of these
// for the scope that does.
#include <cfenv>

namespace dst::test {

class FpTrapDisabled {
 public:
  FpTrapDisabled() : saved_(fegetexcept()) { fedisableexcept(FE_ALL_EXCEPT); }
  FpTrapDisabled(const FpTrapDisabled&) = delete;
  FpTrapDisabled& operator=(const FpTrapDisabled&) = delete;
  ~FpTrapDisabled() {
    feclearexcept(FE_ALL_EXCEPT);  // flags raised on purpose must not trap once re-enabled
    feenableexcept(saved_);
  }

 private:
  int saved_;
};

}  // namespace dst::test
