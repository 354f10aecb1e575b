#pragma once
/// \file startup_watchdog.hpp
/// Deadline for start-up steps that cannot be polled (MPI_Init, MPI_Comm_split_type,
/// Kokkos initialisation, a blocking library call). A monitor thread watches the step
/// in progress; if it runs past its deadline the process prints
/// `[rank R] error: start-up step '<step>' did not finish within T s` and exits with
/// kExitTimeout without calling MPI again (MPI may be what is stuck). mpirun/srun then
/// end the job because a rank exited without MPI_Finalize.

#include <string>

namespace dst::runtime {

class StartupWatchdog {
 public:
  /// Starts the monitor thread (one per process).
  StartupWatchdog();
  ~StartupWatchdog();
  StartupWatchdog(const StartupWatchdog&) = delete;
  StartupWatchdog& operator=(const StartupWatchdog&) = delete;

  /// Marks the start of `step`, which must end (begin() of the next step or done())
  /// within `timeout_s` (<= 0: no deadline).
  void begin(const std::string& step, double timeout_s);
  /// No step in progress.
  void done();
  /// Name of the step in progress ("" when none).
  std::string current() const;

 private:
  struct State;
  State* state_;
};

/// RAII form: begin(step) now, done() when the scope ends normally or by exception.
class StartupStep {
 public:
  StartupStep(StartupWatchdog& watchdog, const std::string& step, double timeout_s)
      : watchdog_(watchdog) {
    watchdog_.begin(step, timeout_s);
  }
  ~StartupStep() { watchdog_.done(); }
  StartupStep(const StartupStep&) = delete;
  StartupStep& operator=(const StartupStep&) = delete;

 private:
  StartupWatchdog& watchdog_;
};

}  // namespace dst::runtime
