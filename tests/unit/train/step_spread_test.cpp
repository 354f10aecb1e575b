// train::step_spread: how far the ranks' work lay apart step by step, and how much of a
// rank's exposed communication was waiting for a slower rank (train/work_spread.hpp).
#include <gtest/gtest.h>

#include <vector>

#include "core/error.hpp"
#include "train/work_spread.hpp"

namespace dst::train {
namespace {

TEST(StepSpread, SlowRankThatChangesFromStepToStepIsSeenStepByStep) {
  // Two ranks taking turns at being 40 ms slower: their mean work is the same (0.52 s each),
  // so a comparison of the means sees nothing; step by step they are 40 ms apart, and this
  // rank (the faster one on steps 0 and 2) waited 40 ms of its 45 ms exposed there.
  const std::vector<double> own{0.50, 0.54, 0.50, 0.54};
  const std::vector<double> comm{0.045, 0.002, 0.045, 0.002};
  const std::vector<double> max{0.54, 0.54, 0.54, 0.54};
  const std::vector<double> min{0.50, 0.50, 0.50, 0.50};
  const StepSpread s = step_spread(own, comm, max, min);
  EXPECT_NEAR(s.straggle_s, 0.040, 1e-12);
  EXPECT_NEAR(s.peer_wait_s, (0.040 + 0.0 + 0.040 + 0.0) / 4, 1e-12);
}

TEST(StepSpread, PeerWaitIsNeverMoreThanTheExposedCommunication) {
  // A rank that started its step late waits less than the slowest rank's lead: the wait
  // counted for the peer is capped at what the rank actually waited.
  const StepSpread s = step_spread({0.30}, {0.010}, {0.35}, {0.30});
  EXPECT_NEAR(s.straggle_s, 0.050, 1e-12);
  EXPECT_NEAR(s.peer_wait_s, 0.010, 1e-12);
}

TEST(StepSpread, SlowestRankWaitsForNoPeer) {
  // The slowest rank's exposed communication is the sum's own tail.
  const StepSpread s = step_spread({0.35, 0.36}, {0.001, 0.002}, {0.35, 0.36}, {0.30, 0.31});
  EXPECT_NEAR(s.straggle_s, 0.050, 1e-12);
  EXPECT_EQ(s.peer_wait_s, 0.0);
}

TEST(StepSpread, NoStepsGiveZerosAndMismatchedLengthsAreRefused) {
  const StepSpread none = step_spread({}, {}, {}, {});
  EXPECT_EQ(none.straggle_s, 0.0);
  EXPECT_EQ(none.peer_wait_s, 0.0);
  EXPECT_THROW(step_spread({0.1, 0.2}, {0.0}, {0.1, 0.2}, {0.1, 0.2}), Error);
}

}  // namespace
}  // namespace dst::train
