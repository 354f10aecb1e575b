// The one poll policy of every deadline-bounded wait (core/poll_policy.hpp).
#include <gtest/gtest.h>

#include <vector>

#include "core/deadline.hpp"
#include "core/poll_policy.hpp"

namespace {

using dst::core::Backoff;
using dst::core::Deadline;
using dst::core::PollPolicy;
using us = std::chrono::microseconds;

std::vector<long> naps(Backoff& b, double elapsed_s, int n) {
  std::vector<long> out;
  for (int i = 0; i < n; ++i)
    out.push_back(static_cast<long>(b.next(elapsed_s).count()));
  return out;
}

TEST(PollPolicy, CollectiveYieldsForOneSecondThenNapsDoublingTo100us) {
  Backoff b(PollPolicy::collective());
  EXPECT_EQ(naps(b, 0.0, 3), (std::vector<long>{0, 0, 0}));
  EXPECT_EQ(naps(b, 0.999, 1), (std::vector<long>{0}));
  // The series starts only when the busy second is over, at the first nap.
  EXPECT_EQ(naps(b, 1.0, 7), (std::vector<long>{10, 20, 40, 80, 100, 100, 100}));
}

TEST(PollPolicy, StartupSleepsAtOnceDoublingTo1ms) {
  Backoff b(PollPolicy::startup());
  EXPECT_EQ(naps(b, 0.0, 9), (std::vector<long>{10, 20, 40, 80, 160, 320, 640, 1000, 1000}));
}

TEST(PollPolicy, PollUntilReturnsTrueOnTheCallThatFindsItDone) {
  int calls = 0;
  const bool done =
      dst::core::poll_until([&] { return ++calls == 5; }, Deadline(0.0), PollPolicy::startup());
  EXPECT_TRUE(done);
  EXPECT_EQ(calls, 5);
}

TEST(PollPolicy, PollUntilReturnsFalseAtTheDeadlineAfterPollingOnceMore) {
  int calls = 0;
  const Deadline deadline(0.05);
  const bool done = dst::core::poll_until(
      [&] {
        ++calls;
        return false;
      },
      deadline, PollPolicy::collective());
  EXPECT_FALSE(done);
  EXPECT_TRUE(deadline.expired());
  EXPECT_GE(calls, 2);
}

TEST(PollPolicy, PollUntilSeesWorkDoneJustBeforeTheDeadline) {
  // done() is asked before the deadline is: a wait whose work finished is never a timeout.
  const Deadline deadline(1e-9);
  while (!deadline.expired()) {
  }
  EXPECT_TRUE(dst::core::poll_until([] { return true; }, deadline, PollPolicy::collective()));
}

}  // namespace
