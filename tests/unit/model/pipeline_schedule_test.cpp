// The 1F1B and interleaved pipeline schedules (model/pipeline_schedule.hpp): every
// micro-batch's forward and backward exactly once per stage (counted), dependencies between
// stages respected (all stages simulated together with blocking neighbour transfers: no
// deadlock), and the in-flight bound that sizes the activation records.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "core/error.hpp"
#include "model/pipeline_schedule.hpp"

namespace dst::model {
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

TEST(PipelineSchedule, InterleavedKnownOrders) {
  EXPECT_EQ(describe(interleaved(2, 0, 2, 2)), "F0 F1 F0c1 F1c1 B0c1 B1c1 B0 B1");
  EXPECT_EQ(describe(interleaved(2, 1, 2, 2)), "F0 F1 F0c1 B0c1 F1c1 B1c1 B0 B1");
  EXPECT_EQ(describe(interleaved(4, 3, 2, 4)),
            "F0 F1 F2 F3 F0c1 B0c1 F1c1 B1c1 F2c1 B2c1 F3c1 B3c1 B0 B1 B2 B3");
  EXPECT_DOUBLE_EQ(bubble_fraction(4, 8, 2), 3.0 / 16.0);
  EXPECT_DOUBLE_EQ(bubble_fraction(4, 8, 1), bubble_fraction(4, 8));
}

TEST(PipelineSchedule, InterleavedRefusesBadArguments) {
  EXPECT_THROW(interleaved(2, 0, 0, 2), Error);
  EXPECT_THROW(interleaved(2, 2, 2, 2), Error);
  EXPECT_THROW(interleaved(2, 0, 2, 0), Error);
  EXPECT_THROW(bubble_fraction(2, 4, 0), Error);
  try {
    interleaved(2, 0, 2, 3);
    ADD_FAILURE() << "3 micro-batches over 2 stages with 2 chunks accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("training.grad_accum_steps"), std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(interleaved(2, 0, 1, 3)) << "one chunk is 1F1B: any micro-batch count";
}

// With one chunk per rank the interleaved order is 1F1B's, for any micro-batch count.
TEST(PipelineSchedule, InterleavedWithOneChunkIsOneFOneB) {
  for (int P = 1; P <= 8; ++P)
    for (std::int64_t m = 1; m <= 12; ++m)
      for (int s = 0; s < P; ++s) {
        EXPECT_EQ(interleaved(P, s, 1, m), one_f_one_b(P, s, m)) << "P " << P << " s " << s;
        EXPECT_EQ(max_in_flight(P, s, 1, m), max_in_flight(P, s, m));
      }
}

// Every (stages, chunks, micro-batches) up to 6 x 4 x 4 groups: each (micro-batch, chunk)
// forward and backward once, a backward after its forward, and the in-flight bound.
TEST(PipelineSchedule, InterleavedEachPairOnceAndInFlightBounded) {
  for (int P = 1; P <= 6; ++P)
    for (int V = 1; V <= 4; ++V)
      for (std::int64_t m = P; m <= 4 * P; m += P)
        for (int s = 0; s < P; ++s) {
          const auto ops = interleaved(P, s, V, m);
          ASSERT_EQ(ops.size(), static_cast<std::size_t>(2 * m * V));
          std::set<std::pair<std::int64_t, int>> forwarded, backwarded;
          std::int64_t in_flight = 0, peak = 0;
          for (const PipeOp& op : ops) {
            ASSERT_LT(op.micro, m);
            ASSERT_GE(op.chunk, 0);
            ASSERT_LT(op.chunk, V);
            const std::pair<std::int64_t, int> pair{op.micro, op.chunk};
            if (op.kind == Kind::forward) {
              EXPECT_TRUE(forwarded.insert(pair).second) << "forward twice: " << describe({op});
              peak = std::max(peak, ++in_flight);
            } else {
              EXPECT_TRUE(forwarded.count(pair) == 1)
                  << "backward before forward: " << describe({op});
              EXPECT_TRUE(backwarded.insert(pair).second) << "backward twice: " << describe({op});
              --in_flight;
            }
          }
          EXPECT_EQ(forwarded.size(), static_cast<std::size_t>(m * V));
          EXPECT_EQ(backwarded.size(), static_cast<std::size_t>(m * V));
          EXPECT_EQ(peak, max_in_flight(P, s, V, m)) << "P " << P << " V " << V << " m " << m;
          // Megatron-LM's bound: the warm-up plus one.
          EXPECT_LE(peak, (V == 1 ? P - s - 1 : 2 * (P - s - 1) + (V - 1) * P) + 1);
        }
}

// All ranks together over the P * V virtual stages (chunk c of rank p is virtual stage
// c * P + p): a forward needs the previous virtual stage's forward of the same micro-batch
// (from rank p - 1, or from rank P - 1's chunk c - 1 on rank 0), a backward its own forward
// and the next virtual stage's backward. Sends complete on their own (the executor's
// isend), receives block; the simulation must finish. Counting one round per op (an op runs
// 1 / V of a stage's layers), each rank is busy 2 m V rounds and idle at most 2 (P - 1):
// the bubble (P - 1) / (V m) that plan and docs state.
TEST(PipelineSchedule, InterleavedRanksTogetherNeverDeadlock) {
  for (int P = 1; P <= 6; ++P)
    for (int V = 1; V <= 4; ++V)
      for (std::int64_t m = P; m <= 4 * P; m += P) {
        std::vector<std::vector<PipeOp>> ops;
        for (int s = 0; s < P; ++s)
          ops.push_back(interleaved(P, s, V, m));
        const int virtual_stages = P * V;
        // (kind, micro-batch, virtual stage) done
        std::set<std::tuple<int, std::int64_t, int>> done;
        std::vector<std::size_t> at(static_cast<std::size_t>(P), 0);
        std::size_t remaining = static_cast<std::size_t>(P) * ops[0].size();
        std::int64_t rounds = 0;
        while (remaining > 0) {
          std::vector<std::tuple<int, std::int64_t, int>> finished;  // seen next round
          for (int s = 0; s < P; ++s) {
            const auto si = static_cast<std::size_t>(s);
            if (at[si] == ops[si].size()) continue;
            const PipeOp op = ops[si][at[si]];
            const int stage = op.chunk * P + s;
            const bool ready = op.kind == Kind::forward
                                   ? stage == 0 || done.count({0, op.micro, stage - 1}) == 1
                                   : done.count({0, op.micro, stage}) == 1 &&
                                         (stage == virtual_stages - 1 ||
                                          done.count({1, op.micro, stage + 1}) == 1);
            if (!ready) continue;
            finished.emplace_back(op.kind == Kind::forward ? 0 : 1, op.micro, stage);
            ++at[si];
            --remaining;
          }
          ASSERT_FALSE(finished.empty()) << "deadlock with P " << P << ", V " << V << ", m " << m;
          done.insert(finished.begin(), finished.end());
          ++rounds;
        }
        EXPECT_LE(rounds, 2 * m * V + 2 * (P - 1)) << "P " << P << " V " << V << " m " << m;
      }
}

// Each chunk's records: micro-batch i uses record i mod chunk_in_flight()[chunk] (what the
// trainer does); no record may be taken while another micro-batch still holds it. The last
// rank's last chunk (the head's) keeps one: its backward follows its forward at once.
TEST(PipelineSchedule, ChunkRecordsAreNeverSharedByTwoMicroBatchesInFlight) {
  for (int P = 1; P <= 5; ++P)
    for (int V = 1; V <= 4; ++V)
      for (std::int64_t m = P; m <= 3 * P; m += P)
        for (int s = 0; s < P; ++s) {
          const std::vector<std::int64_t> records = chunk_in_flight(P, s, V, m);
          ASSERT_EQ(records.size(), static_cast<std::size_t>(V));
          std::int64_t sum = 0;
          std::vector<std::map<std::int64_t, std::int64_t>> held(static_cast<std::size_t>(V));
          for (const PipeOp& op : interleaved(P, s, V, m)) {
            const auto c = static_cast<std::size_t>(op.chunk);
            const std::int64_t r = op.micro % records[c];
            if (op.kind == Kind::forward) {
              EXPECT_EQ(held[c].count(r), 0u)
                  << "P " << P << " V " << V << " m " << m << " rank " << s << ": "
                  << describe({op}) << " takes record " << r << " of micro-batch " << held[c][r];
              held[c][r] = op.micro;
            } else {
              EXPECT_EQ(held[c].at(r), op.micro);
              held[c].erase(r);
            }
          }
          for (const std::int64_t n : records) {
            EXPECT_GE(n, 1);
            sum += n;
          }
          EXPECT_GE(sum, max_in_flight(P, s, V, m));
          if (s == P - 1) EXPECT_EQ(records.back(), 1) << "P " << P << " V " << V << " m " << m;
          if (V == 1) EXPECT_EQ(records[0], max_in_flight(P, s, m));
        }
  // Megatron's example shape, P 4, V 2, m 8: chunk 0 of rank 0 holds two groups of P.
  EXPECT_EQ(chunk_in_flight(4, 0, 2, 8), (std::vector<std::int64_t>{8, 4}));
  EXPECT_EQ(chunk_in_flight(4, 3, 2, 8), (std::vector<std::int64_t>{5, 1}));
}

}  // namespace
}  // namespace dst::model
