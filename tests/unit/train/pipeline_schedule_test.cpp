// The 1F1B pipeline schedule (train/pipeline_schedule.hpp): every micro-batch's forward
// and backward exactly once per stage (counted), dependencies between stages respected
// (all stages simulated together with blocking neighbour transfers: no deadlock), and the
// in-flight bound that sizes the activation records.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/error.hpp"
#include "train/pipeline_schedule.hpp"

namespace dst::train {
namespace {

using Kind = PipeOp::Kind;

TEST(PipelineSchedule, KnownOrders) {
  EXPECT_EQ(describe(one_f_one_b(1, 0, 3)), "F0 B0 F1 B1 F2 B2");
  EXPECT_EQ(describe(one_f_one_b(2, 0, 4)), "F0 F1 B0 F2 B1 F3 B2 B3");
  EXPECT_EQ(describe(one_f_one_b(2, 1, 4)), "F0 B0 F1 B1 F2 B2 F3 B3");
  EXPECT_EQ(describe(one_f_one_b(4, 0, 2)), "F0 F1 B0 B1");
  EXPECT_DOUBLE_EQ(bubble_fraction(4, 8), 3.0 / 8.0);
  EXPECT_DOUBLE_EQ(bubble_fraction(1, 8), 0.0);
}

TEST(PipelineSchedule, RefusesBadArguments) {
  EXPECT_THROW(one_f_one_b(0, 0, 1), Error);
  EXPECT_THROW(one_f_one_b(2, 2, 1), Error);
  EXPECT_THROW(one_f_one_b(2, -1, 1), Error);
  EXPECT_THROW(one_f_one_b(2, 0, 0), Error);
}

// Every (stages, micro-batches) up to 8 x 12: counts, own order, in-flight bound.
TEST(PipelineSchedule, EachMicroBatchOnceAndInFlightBounded) {
  for (int P = 1; P <= 8; ++P)
    for (std::int64_t m = 1; m <= 12; ++m)
      for (int s = 0; s < P; ++s) {
        const auto ops = one_f_one_b(P, s, m);
        ASSERT_EQ(ops.size(), static_cast<std::size_t>(2 * m));
        std::vector<int> fwd(static_cast<std::size_t>(m)), bwd(static_cast<std::size_t>(m));
        std::int64_t in_flight = 0, peak = 0, next_f = 0, next_b = 0;
        for (const PipeOp& op : ops) {
          const auto i = static_cast<std::size_t>(op.micro);
          ASSERT_LT(op.micro, m);
          if (op.kind == Kind::forward) {
            EXPECT_EQ(op.micro, next_f++) << "forwards in order";
            ++fwd[i];
            peak = std::max(peak, ++in_flight);
          } else {
            EXPECT_EQ(op.micro, next_b++) << "backwards in order";
            EXPECT_EQ(fwd[i], 1) << "backward of " << op.micro << " before its forward";
            ++bwd[i];
            --in_flight;
          }
        }
        for (std::int64_t i = 0; i < m; ++i) {
          EXPECT_EQ(fwd[static_cast<std::size_t>(i)], 1) << "P " << P << " s " << s << " m " << m;
          EXPECT_EQ(bwd[static_cast<std::size_t>(i)], 1) << "P " << P << " s " << s << " m " << m;
        }
        EXPECT_LE(peak, P - s);
        EXPECT_EQ(peak, max_in_flight(P, s, m));
      }
}

// All stages together: a forward of stage s needs stage s - 1's forward of the same
// micro-batch (its activations), a backward needs stage s + 1's backward (its gradient).
// Each stage runs its ops in order, blocking until the dependency is done; the
// simulation must finish (a stuck round means a deadlock).
TEST(PipelineSchedule, StagesTogetherNeverDeadlock) {
  for (int P = 1; P <= 8; ++P)
    for (std::int64_t m = 1; m <= 12; ++m) {
      std::vector<std::vector<PipeOp>> ops;
      for (int s = 0; s < P; ++s)
        ops.push_back(one_f_one_b(P, s, m));
      std::vector<std::size_t> at(static_cast<std::size_t>(P), 0);
      std::vector<std::vector<int>> f_done(static_cast<std::size_t>(P),
                                           std::vector<int>(static_cast<std::size_t>(m), 0));
      auto b_done = f_done;
      std::size_t remaining = static_cast<std::size_t>(P) * ops[0].size();
      while (remaining > 0) {
        bool progressed = false;
        for (int s = 0; s < P; ++s) {
          const auto si = static_cast<std::size_t>(s);
          if (at[si] == ops[si].size()) continue;
          const PipeOp op = ops[si][at[si]];
          const auto i = static_cast<std::size_t>(op.micro);
          bool ready = false;
          if (op.kind == Kind::forward)
            ready = s == 0 || f_done[si - 1][i] == 1;
          else
            ready = f_done[si][i] == 1 && (s == P - 1 || b_done[si + 1][i] == 1);
          if (!ready) continue;
          (op.kind == Kind::forward ? f_done : b_done)[si][i] += 1;
          ++at[si];
          --remaining;
          progressed = true;
        }
        ASSERT_TRUE(progressed) << "deadlock with P " << P << ", m " << m;
      }
      for (int s = 0; s < P; ++s)
        for (std::int64_t i = 0; i < m; ++i) {
          EXPECT_EQ(f_done[static_cast<std::size_t>(s)][static_cast<std::size_t>(i)], 1);
          EXPECT_EQ(b_done[static_cast<std::size_t>(s)][static_cast<std::size_t>(i)], 1);
        }
    }
}

}  // namespace
}  // namespace dst::train
