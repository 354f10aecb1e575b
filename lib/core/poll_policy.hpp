#pragma once
/// \file poll_policy.hpp
/// How every deadline-bounded wait in dstrain polls (an MPI request, a shared-memory sum,
/// an NCCL operation): test, and between tests first yield the core while the wait is
/// young, then sleep, the naps doubling up to a ceiling. One policy, so the waits agree on
/// what "a late peer" costs and oversubscribed ranks leave the cores to the ranks working.

#include <chrono>

#include "core/deadline.hpp"

namespace dst::core {

/// The pause schedule of one kind of wait.
struct PollPolicy {
  double busy_s;                        ///< yield (no sleep) while the wait is this young
  std::chrono::microseconds first_nap;  ///< then sleep this long, doubling ...
  std::chrono::microseconds max_nap;    ///< ... up to this

  /// A collective in flight: Open MPI progresses it only inside MPI calls, so poll
  /// continuously (yielding) for 1 s, then back off to naps of 10 us growing to 100 us
  /// once a peer is late, so a late peer's transfer still progresses at a useful rate.
  /// (Sleeping up to 1 ms from the start made a 16 MiB allreduce on 2 ranks ~100x
  /// slower: 405 ms against 4 ms for a blocking MPI_Allreduce.)
  static constexpr PollPolicy collective() {
    return {1.0, std::chrono::microseconds(10), std::chrono::microseconds(100)};
  }
  /// Start-up work that takes tens of milliseconds to seconds (an NCCL communicator's
  /// initialisation): nothing to overlap, latency does not matter, so sleep at once,
  /// 10 us doubling to 1 ms.
  static constexpr PollPolicy startup() {
    return {0.0, std::chrono::microseconds(10), std::chrono::microseconds(1000)};
  }
};

/// The pauses between the polls of one wait, following a PollPolicy.
class Backoff {
 public:
  explicit Backoff(const PollPolicy& policy) : policy_(policy), nap_(policy.first_nap) {}

  /// The pause after a poll that found the wait unfinished, `elapsed_s` into the wait:
  /// zero (yield) while elapsed_s < busy_s, else the next nap of the doubling series.
  std::chrono::microseconds next(double elapsed_s);
  /// Yields or sleeps for next(elapsed_s).
  void pause(double elapsed_s);

 private:
  PollPolicy policy_;
  std::chrono::microseconds nap_;
};

/// Calls `done()` until it returns true (returns true) or `deadline` expires (returns
/// false), pausing between calls as `policy` says. `done` is called at least once, and
/// once more after the last pause, so an operation that completes just before the
/// deadline is seen. Whatever `done` throws passes through.
template <class Done>
bool poll_until(Done&& done, const Deadline& deadline, const PollPolicy& policy) {
  Backoff backoff(policy);
  for (;;) {
    if (done()) return true;
    if (deadline.expired()) return false;
    backoff.pause(deadline.elapsed_s());
  }
}

}  // namespace dst::core
