#pragma once
// The subcommands of the dstrain executable. Each returns the process exit code.

#include "cli.hpp"
#include "runtime/runtime.hpp"

namespace dst::app {

int run_version();
/// Runs under a started runtime (MPI, Kokkos are up).
int run_check(runtime::Runtime& rt, const Command& cmd);

}  // namespace dst::app
