// The shared-memory sum (comm/shared_sum.hpp) at 1, 2 and 4 ranks: every rank ends with
// the same bits, the sum in rank order; ranges of any length and slots used again; the
// same bits as MPI's all-reduce for two ranks; a rank that does not start is named by
// the others' timeout, and the sum completes once it does.
#include "comm/shared_sum.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "comm/mpi_communicator.hpp"
#include "core/bulk_memory.hpp"
#include "core/error.hpp"
#include "mpi_world.hpp"

namespace dst::comm {
namespace {

using dst::test::world_rank;
using dst::test::world_size;

// Element i of rank r at use u: floats of mixed magnitudes and signs, so that a
// different summation order would change the last bits.
float value(std::size_t i, int rank, int use) {
  std::uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ull ^ (static_cast<std::uint64_t>(rank) << 40) ^
                    (static_cast<std::uint64_t>(use) << 52);
  h ^= h >> 31;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 29;
  const float unit = static_cast<float>(h >> 40) / static_cast<float>(1u << 24);  // [0, 1)
  const float scale = static_cast<float>(1u << (h & 15));
  return (unit - 0.5f) * scale;
}

// The sum in rank order, as the shared sum adds it.
float rank_order_sum(std::size_t i, int use) {
  float s = value(i, 0, use);
  for (int r = 1; r < world_size(); ++r)
    s += value(i, r, use);
  return s;
}

std::uint32_t bits(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

// The last rank starts late. Every other rank starts its operation with `start`, waits
// 0.3 s and returns the TimeoutError's message; once every rank is past that, the last
// rank starts too (returning "") and every operation completes: a request stays pending
// and valid after a timeout.
std::string timeout_while_the_last_rank_is_late(const std::function<Request()>& start) {
  std::string msg;
  if (world_rank() != world_size() - 1) {
    Request r = start();
    try {
      r.wait_for(0.3);
      ADD_FAILURE() << "completed without the last rank";
    } catch (const TimeoutError& e) {
      msg = e.what();
    }
    MPI_Barrier(MPI_COMM_WORLD);  // the late rank starts only after every timeout
    r.wait_for(60.0);
  } else {
    MPI_Barrier(MPI_COMM_WORLD);
    start().wait_for(60.0);
  }
  return msg;
}

TEST(SharedSum, PartsCoverEveryRangeOnceOnWholeCacheLines) {
  for (int ranks : {1, 2, 3, 4, 8})
    for (std::size_t count : {0u, 1u, 15u, 16u, 17u, 100u, 1000003u}) {
      std::size_t expect_first = 0;
      for (int r = 0; r < ranks; ++r) {
        std::size_t first = 0, last = 0;
        SharedSum::part_of(count, ranks, r, first, last);
        EXPECT_EQ(first, expect_first) << ranks << " ranks, count " << count << ", rank " << r;
        EXPECT_LE(first, last);
        if (last < count) {
          EXPECT_EQ(last % 16, 0u) << "a part must end on a cache line";
        }
        expect_first = last;
      }
      EXPECT_EQ(expect_first, count) << ranks << " ranks, count " << count;
    }
}

TEST(SharedSum, EveryRangeEndsWithTheRankOrderSumOnEveryRank) {
  MpiCommunicator world(MPI_COMM_WORLD, "data", 60.0);
  constexpr std::size_t kElements = 100003;  // not a multiple of any line or rank count
  SharedSum sum(world, kElements, 6);
  ASSERT_EQ(sum.elements(), kElements);
  ASSERT_EQ(sum.size(), world_size());
  float* g = sum.local();
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(g) % 64, 0u) << "the buffer starts on a cache line";
  for (std::size_t i = 0; i < kElements; ++i)
    ASSERT_EQ(g[i], 0.0f) << "the buffer starts zero-filled";
  // Ranges of every kind, each slot used again by each of the three uses.
  struct Range {
    std::size_t slot, begin, count;
  };
  const std::vector<Range> ranges = {{0, 0, 1},  {1, 1, 5},      {2, 6, 0},
                                     {3, 6, 61}, {4, 67, 50000}, {5, 50067, kElements - 50067}};
  for (int use = 0; use < 3; ++use) {
    for (std::size_t i = 0; i < kElements; ++i)
      g[i] = value(i, world_rank(), use);
    std::vector<Request> requests;
    for (const auto& r : ranges)
      requests.push_back(sum.isum(r.slot, r.begin, r.count));
    // Complete them in reverse: the sums do not depend on the order they are waited.
    for (std::size_t k = requests.size(); k-- > 0;)
      requests[k].wait();
    for (std::size_t i = 0; i < kElements; ++i)
      ASSERT_EQ(bits(g[i]), bits(rank_order_sum(i, use))) << "element " << i << ", use " << use;
    // Every rank holds the same bits: compare a checksum of the whole buffer.
    std::uint64_t h = 1469598103934665603ull;
    for (std::size_t i = 0; i < kElements; ++i)
      h = (h ^ bits(g[i])) * 1099511628211ull;
    std::uint64_t lo = h, hi = h;
    MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    EXPECT_EQ(lo, hi) << "ranks hold different sums";
  }
}

// Two ranks: a + b == b + a, so whatever algorithm MPI picks, its sum has these bits
// (which is why parallel.backend shm and mpi train identically on two ranks).
TEST(SharedSum, TwoRanksGiveTheBitsOfMpiAllreduce) {
  if (world_size() > 2) GTEST_SKIP() << "summation order of more than two ranks is MPI's choice";
  MpiCommunicator world(MPI_COMM_WORLD, "data", 60.0);
  constexpr std::size_t kElements = 70001;
  SharedSum sum(world, kElements, 1);
  std::vector<float> reference(kElements);
  for (std::size_t i = 0; i < kElements; ++i)
    sum.local()[i] = reference[i] = value(i, world_rank(), 7);
  sum.isum(0, 0, kElements).wait();
  MPI_Allreduce(MPI_IN_PLACE, reference.data(), static_cast<int>(kElements), MPI_FLOAT, MPI_SUM,
                MPI_COMM_WORLD);
  for (std::size_t i = 0; i < kElements; ++i)
    ASSERT_EQ(bits(sum.local()[i]), bits(reference[i])) << "element " << i;
}

// A scanned sum leaves each rank its own first non-finite element, found by whichever rank
// added that part: rank r (r > 0) puts a NaN and, later, an infinity into its buffer, at
// offsets that fall into different ranks' parts and different chunks; rank 0 none. An
// unscanned sum, or one after reset_nonfinite(), records nothing.
TEST(SharedSum, ScannedSumNamesEachRanksFirstNonFiniteValue) {
  MpiCommunicator world(MPI_COMM_WORLD, "data", 60.0);
  constexpr std::size_t kElements = 90001;
  SharedSum sum(world, kElements, 2);
  const int r = world_rank();
  const std::size_t nan_at = 5003 + 17 * static_cast<std::size_t>(r);
  const std::size_t inf_at = 80000 + static_cast<std::size_t>(r);
  const auto fill = [&] {
    for (std::size_t i = 0; i < kElements; ++i)
      sum.local()[i] = value(i, r, 3);
    if (r > 0) {
      sum.local()[inf_at] = std::numeric_limits<float>::infinity();
      sum.local()[nan_at] = std::numeric_limits<float>::quiet_NaN();
    }
  };
  EXPECT_EQ(sum.first_nonfinite(), -1) << "nothing recorded before any sum";
  fill();
  sum.isum(0, 0, kElements).wait();
  EXPECT_EQ(sum.first_nonfinite(), -1) << "an unscanned sum records nothing";
  MPI_Barrier(MPI_COMM_WORLD);  // every rank read it before any rank's next sum
  fill();
  // Two ranges on two slots, the higher one first: the lower offset must still win.
  Request high = sum.isum(1, 60000, kElements - 60000, 0, true);
  Request low = sum.isum(0, 0, 60000, 0, true);
  high.wait();
  low.wait();
  const std::int64_t expect = world_size() == 1 || r == 0 ? -1 : static_cast<std::int64_t>(nan_at);
  // A group of one sums nothing, so nothing is checked (GradBuckets scans that case itself).
  EXPECT_EQ(sum.first_nonfinite(), expect);
  // Only the infinity, in the high range: its offset.
  MPI_Barrier(MPI_COMM_WORLD);
  sum.reset_nonfinite();
  MPI_Barrier(MPI_COMM_WORLD);  // every rank forgot before any rank's next scanned sum
  fill();
  if (r > 0) sum.local()[nan_at] = 1.0f;
  sum.isum(0, 0, kElements, 0, true).wait();
  EXPECT_EQ(sum.first_nonfinite(),
            world_size() == 1 || r == 0 ? -1 : static_cast<std::int64_t>(inf_at));
}

TEST(SharedSum, RangesOutsideTheBufferOrSlotsAreErrors) {
  MpiCommunicator world(MPI_COMM_WORLD, "data", 60.0);
  SharedSum sum(world, 1000, 2);
  EXPECT_THROW(sum.isum(2, 0, 10), Error);
  EXPECT_THROW(sum.isum(0, 990, 11), Error);
  EXPECT_THROW(sum.isum(0, 1001, 0), Error);
  // Nothing was started by those: a real sum still pairs up across ranks.
  for (std::size_t i = 0; i < 1000; ++i)
    sum.local()[i] = 1.0f;
  Request pending = sum.isum(0, 0, 1000);
  EXPECT_THROW(sum.isum(0, 0, 1000), Error) << "the slot's last sum has not completed";
  pending.wait();
  for (std::size_t i = 0; i < 1000; ++i)
    ASSERT_EQ(sum.local()[i], static_cast<float>(world_size()));
}

// The gather: each rank's part of a range (part_of) written only by its owner ends in
// every rank's buffer; a gather in buffer 1 leaves buffer 0 alone, slots are shared by
// sums and gathers, and ranges of any length are gathered again and again.
TEST(SharedSum, GatherPutsEveryRanksPartIntoEveryBuffer) {
  MpiCommunicator world(MPI_COMM_WORLD, "data", 60.0);
  constexpr std::size_t kElements = 50021;
  SharedSum shared(world, kElements, 2, 2);
  ASSERT_EQ(shared.buffers(), 2u);
  float* g = shared.local(0);
  float* p = shared.local(1);
  EXPECT_NE(g, p);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 64, 0u) << "every buffer starts on a line";
  for (std::size_t i = 0; i < kElements; ++i)
    ASSERT_EQ(p[i], 0.0f) << "every buffer starts zero-filled";
  struct Range {
    std::size_t begin, count;
  };
  const std::vector<Range> ranges = {{0, kElements}, {3, 1}, {100, 17}, {5000, 40000}};
  for (int use = 0; use < 3; ++use)
    for (const auto& r : ranges) {
      for (std::size_t i = 0; i < kElements; ++i)
        g[i] = value(i, world_rank(), 9);
      // This rank writes its own part only; the rest holds a marker the peers overwrite.
      std::size_t first = 0, last = 0;
      SharedSum::part_of(r.count, world_size(), world_rank(), first, last);
      for (std::size_t i = 0; i < kElements; ++i)
        p[i] = -1.0f;
      for (std::size_t i = r.begin + first; i < r.begin + last; ++i)
        p[i] = value(i, world_rank(), use);
      MPI_Barrier(MPI_COMM_WORLD);  // every rank's markers are down before any copies
      shared.igather(1, r.begin, r.count, 1).wait();
      for (std::size_t i = 0; i < kElements; ++i) {
        if (i < r.begin || i >= r.begin + r.count) {
          ASSERT_EQ(p[i], -1.0f) << "element " << i << " outside the range was written";
          continue;
        }
        int owner = 0;
        for (int q = 0; q < world_size(); ++q) {
          SharedSum::part_of(r.count, world_size(), q, first, last);
          if (i - r.begin >= first && i - r.begin < last) owner = q;
        }
        ASSERT_EQ(bits(p[i]), bits(value(i, owner, use)))
            << "element " << i << " of range [" << r.begin << ", " << r.begin + r.count << "), use "
            << use << ": not rank " << owner << "'s";
      }
      for (std::size_t i = 0; i < kElements; ++i)
        ASSERT_EQ(bits(g[i]), bits(value(i, world_rank(), 9))) << "buffer 0 was written";
      MPI_Barrier(MPI_COMM_WORLD);  // no rank reuses its buffer while a peer checks its own
    }
  // A sum on the same slot after the gathers pairs up as ever.
  for (std::size_t i = 0; i < kElements; ++i)
    g[i] = value(i, world_rank(), 4);
  shared.isum(1, 0, kElements, 0).wait();
  for (std::size_t i = 0; i < kElements; ++i)
    ASSERT_EQ(bits(g[i]), bits(rank_order_sum(i, 4))) << "element " << i;
  EXPECT_THROW(shared.igather(0, 0, 10, 2), Error) << "there is no buffer 2";
}

// A gather whose parts are large enough to go out with streaming stores
// (core/bulk_memory.hpp: weakly ordered, fenced before the rank marks its part done):
// every element of every part arrives, starting off a cache line, the rest untouched.
TEST(SharedSum, GatherOfPartsLargeEnoughToStreamDeliversEveryElement) {
  if (world_size() < 2) GTEST_SKIP() << "needs a peer: one rank copies nothing";
  MpiCommunicator world(MPI_COMM_WORLD, "data", 120.0);
  const std::size_t per_rank = core::kStreamingStoreBytes / sizeof(float) + 37;
  const std::size_t begin = 3;  // 12 bytes past a line: the copies start mid-line
  const std::size_t count = per_rank * static_cast<std::size_t>(world_size());
  const std::size_t elements = begin + count + 5;
  SharedSum shared(world, elements, 1);
  std::size_t first = 0, last = 0;
  SharedSum::part_of(count, world_size(), world_rank(), first, last);
  ASSERT_GE((last - first) * sizeof(float), core::kStreamingStoreBytes) << "a part streams";
  float* p = shared.local();
  for (std::size_t i = 0; i < elements; ++i)
    p[i] = -1.0f;
  for (std::size_t i = begin + first; i < begin + last; ++i)
    p[i] = value(i, world_rank(), 5);
  MPI_Barrier(MPI_COMM_WORLD);
  shared.igather(0, begin, count, 0).wait();
  std::size_t first0 = 0, per = 0;  // every part but the last is rank 0's length
  SharedSum::part_of(count, world_size(), 0, first0, per);
  for (std::size_t i = 0; i < elements; ++i) {
    if (i < begin || i >= begin + count) {
      ASSERT_EQ(p[i], -1.0f) << "element " << i << " outside the range was written";
      continue;
    }
    const int owner = static_cast<int>((i - begin) / per);
    ASSERT_EQ(bits(p[i]), bits(value(i, owner, 5)))
        << "element " << i << ": not rank " << owner << "'s";
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(SharedSum, GatherTimeoutNamesTheRankThatHasNotStarted) {
  if (world_size() < 2) GTEST_SKIP() << "needs a peer";
  MpiCommunicator world(MPI_COMM_WORLD, "data", 60.0);
  SharedSum shared(world, 1024, 1, 2);
  const int late = world_size() - 1;
  const std::string msg =
      timeout_while_the_last_rank_is_late([&] { return shared.igather(0, 0, 1024, 1); });
  if (world_rank() == late) return;
  EXPECT_NE(msg.find("shm: allgather in place of 1024 x f32"), std::string::npos) << msg;
  EXPECT_NE(msg.find("of buffer 1, slot 0 did not complete within 0.3 s"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("not started by rank(s): "), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(late) + ";"), std::string::npos) << msg;
}

// The last rank starts late: the others' short deadline names it, and the sum completes
// when it arrives (the request stays pending and valid after a timeout).
TEST(SharedSum, TimeoutNamesTheRankThatHasNotStarted) {
  if (world_size() < 2) GTEST_SKIP() << "needs a peer";
  MpiCommunicator world(MPI_COMM_WORLD, "data", 60.0);
  constexpr std::size_t kElements = 4096;
  SharedSum sum(world, kElements, 1);
  const int late = world_size() - 1;
  for (std::size_t i = 0; i < kElements; ++i)
    sum.local()[i] = value(i, world_rank(), 3);
  const std::string msg =
      timeout_while_the_last_rank_is_late([&] { return sum.isum(0, 0, kElements); });
  if (world_rank() != late) {
    EXPECT_NE(msg.find("shm: allreduce(sum) of 4096 x f32"), std::string::npos) << msg;
    EXPECT_NE(msg.find("did not complete within 0.3 s"), std::string::npos) << msg;
    // The late rank is among those not started (a slow peer may be listed too).
    const std::string lead = "not started by rank(s): ";
    const auto at = msg.find(lead);
    ASSERT_NE(at, std::string::npos) << msg;
    const std::string listed =
        ", " + msg.substr(at + lead.size(), msg.find(';', at) - at - lead.size()) + ",";
    EXPECT_NE(listed.find(", " + std::to_string(late) + ","), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank " + std::to_string(world_rank()) + " waited"), std::string::npos)
        << msg;
  }
  for (std::size_t i = 0; i < kElements; ++i)
    ASSERT_EQ(bits(sum.local()[i]), bits(rank_order_sum(i, 3))) << "element " << i;
}

}  // namespace
}  // namespace dst::comm
