// Kokkos lives for the whole test program: initialised once before the first test and
// finalised after the last (Kokkos cannot be initialised again after finalize).
#include <gtest/gtest.h>

#include <Kokkos_Core.hpp>

namespace {

class KokkosEnvironment : public ::testing::Environment {
 public:
  void SetUp() override { Kokkos::initialize(); }
  void TearDown() override { Kokkos::finalize(); }
};

// Registered during static initialisation, before test_main.cpp runs the tests; gtest
// owns the object.
[[maybe_unused]] ::testing::Environment* const kEnvironment =
    ::testing::AddGlobalTestEnvironment(new KokkosEnvironment);

}  // namespace
