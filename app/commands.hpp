#pragma once
// The subcommands of the dstrain executable. Each returns the process exit code.

#include "cli.hpp"
#include "runtime/runtime.hpp"

namespace dst::app {

int run_version();
/// Runs under a started runtime (MPI, Kokkos are up).
int run_check(runtime::Runtime& rt, const Command& cmd);
int run_train(runtime::Runtime& rt, const Command& cmd);
/// `dstrain prep`: corpus -> token shards, in parallel over the ranks.
int run_prep(runtime::Runtime& rt, const Command& cmd);
/// `dstrain tokenize ...`: argv[0] is "tokenize". Needs no MPI or Kokkos.
int run_tokenize(int argc, char** argv);

}  // namespace dst::app
