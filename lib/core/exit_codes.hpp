#pragma once
/// \file exit_codes.hpp
/// Process exit codes of dstrain, documented in docs/exit-codes.md. Job scripts rely on
/// them (e.g. a requeue script distinguishes a pre-empted run from a failed one).

namespace dst {

enum ExitCode : int {
  kExitOk = 0,
  kExitError = 1,       ///< any runtime failure not listed below
  kExitUsage = 2,       ///< bad command line
  kExitDeck = 3,        ///< invalid run deck or override
  kExitTimeout = 4,     ///< a collective or start-up step missed its deadline
  kExitPlan = 5,        ///< `check`: the plan needs more memory than a rank has
  kExitDiverged = 6,    ///< training: non-finite gradients (nan_policy abort) or ranks whose
                        ///< parameters differ
  kExitPreempted = 7,   ///< stopped on request (SIGUSR1, SIGTERM, SIGINT) after saving a
                        ///< checkpoint: requeue the job and it resumes
  kExitCheckpoint = 8,  ///< a checkpoint could not be written, or none could be loaded
  kExitInjected = 9,    ///< a debug.inject_* fault ended this process (tests only)
};

}  // namespace dst
