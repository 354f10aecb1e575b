#pragma once
// The message of the dst::Error a callable throws, for tests that check what an error
// says (unit tests and the GPU tests alike; tests/unit is on their include path).
#include <string>
#include <utility>

#include "core/error.hpp"

namespace dst::test {

/// The message of the dst::Error `f` throws, or "" when it throws none.
template <class F>
std::string error_of(F&& f) {
  try {
    std::forward<F>(f)();
  } catch (const dst::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace dst::test
