#pragma once
/// \file hang_watchdog.hpp
/// The training loop's dead-man switch (docs/operations.md, "hangs"). A monitor thread
/// watches the flight recorder's heartbeat (core/flight_recorder.hpp): when this rank has
/// made no progress (no operation begun or ended) for `timeout_s`, it prints
///   [rank R] error: no progress for T s at step S: stuck in <operation>
///   recent operations on rank R (flight recorder, oldest first): ...
/// and ends the process with kExitTimeout without calling MPI (MPI may be what is
/// stuck); the launcher then ends the job because a rank exited without MPI_Finalize.
/// Collectives have their own deadline (parallel.timeout_s) and report the same way from
/// the ranks that wait; the watchdog catches what no deadline covers: a rank stuck
/// outside a collective (a hung read, a blocking library call such as an HDF5 collective
/// write, a livelock). It fires kGraceSeconds after the timeout, so that where both
/// apply the collective's own, more specific report comes first; a job with a hung rank
/// therefore ends within parallel.timeout_s + kGraceSeconds (+ the launcher's clean-up).

namespace dst::runtime {

class HangWatchdog {
 public:
  static constexpr double kGraceSeconds = 15.0;

  /// Starts watching at once: fires after timeout_s + kGraceSeconds without progress;
  /// timeout_s <= 0 disables it.
  explicit HangWatchdog(double timeout_s);
  ~HangWatchdog();
  HangWatchdog(const HangWatchdog&) = delete;
  HangWatchdog& operator=(const HangWatchdog&) = delete;

 private:
  struct State;
  State* state_;
};

}  // namespace dst::runtime
