// Bucketed gradient all-reduce (train/grad_buckets.hpp) at 1, 2 and 4 ranks: every bucket
// ends with the sum over ranks, with and without overlap; with overlap, the progress
// thread completes the buckets started during backward while the owner does not call
// MPI at all (what makes the all-reduce overlap the computation: Open MPI has no
// asynchronous progress of its own).
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include "comm/mpi_communicator.hpp"
#include "comm/shared_sum.hpp"
#include "core/error.hpp"
#include "mpi_world.hpp"
#include "train/grad_buckets.hpp"
#include "train/zero_shards.hpp"

namespace dst::train {
namespace {

using dst::test::world_rank;
using dst::test::world_size;

// Element i of rank r: small integers, so every summation order gives the same sum exactly.
float value(std::size_t i, int rank) {
  return static_cast<float>((i * 7 + static_cast<std::size_t>(rank) * 3) % 101);
}

// 1 MiB of gradients in 64 KiB buckets: 16 buckets, the last one first.
constexpr std::size_t kElements = 256 * 1024;
constexpr double kBucketBytes = 64 * 1024;

void expect_sums(const std::vector<float>& g) {
  const int n = world_size();
  for (std::size_t i = 0; i < g.size(); ++i) {
    float want = 0.0f;
    for (int r = 0; r < n; ++r)
      want += value(i, r);
    ASSERT_EQ(g[i], want) << "element " << i;  // integers: exact in any order
  }
}

class GradBucketsTest : public ::testing::TestWithParam<bool> {};

TEST_P(GradBucketsTest, EveryBucketEndsWithTheSumOverRanksForSeveralSteps) {
  comm::MpiCommunicator data(MPI_COMM_WORLD, "data", 60.0);
  std::vector<float> g(kElements);
  GradBuckets buckets(data, g.data(), g.size(), kBucketBytes, GetParam());
  EXPECT_EQ(buckets.bucket_count(), 16u);
  for (int step = 0; step < 3; ++step) {
    for (std::size_t i = 0; i < g.size(); ++i)
      g[i] = value(i, world_rank());
    buckets.reset();
    // Backward finishes the buffer from its end, in eight stretches.
    for (std::size_t k = 8; k-- > 0;)
      buckets.ready(k * (kElements / 8));
    EXPECT_GE(buckets.wait_all(), 0.0);
    EXPECT_EQ(buckets.completed(), buckets.bucket_count());
    expect_sums(g);
    EXPECT_EQ(buckets.first_nonfinite_offset(), -1);
  }
}

TEST_P(GradBucketsTest, ProgressThreadCompletesStartedBucketsWhileTheOwnerComputes) {
  comm::MpiCommunicator data(MPI_COMM_WORLD, "data", 60.0);
  const bool overlap = GetParam();
  std::vector<float> g(kElements);
  for (std::size_t i = 0; i < g.size(); ++i)
    g[i] = value(i, world_rank());
  GradBuckets buckets(data, g.data(), g.size(), kBucketBytes, overlap);
  // A thread exactly when there is something to overlap and MPI allows it (the test main
  // asks for MPI_THREAD_MULTIPLE, as dstrain does).
  EXPECT_EQ(buckets.progress_thread(), overlap && world_size() > 1);
  buckets.ready(0);  // every bucket is final
  if (buckets.progress_thread()) {
    // The owner "computes" (no MPI call) until the thread has completed every bucket;
    // without it nothing would move. 30 s: far beyond the milliseconds this takes.
    const auto t0 = std::chrono::steady_clock::now();
    while (buckets.completed() < buckets.bucket_count() &&
           std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30))
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_EQ(buckets.completed(), buckets.bucket_count());
  } else if (!overlap) {
    EXPECT_EQ(buckets.completed(), 0u);  // nothing starts before wait_all()
  }
  buckets.wait_all();
  expect_sums(g);
}

// The path a GPU run over MPI takes (device gradients, host-memory communicator): each
// bucket is copied to a host buffer when it starts and summed there; the gradients
// themselves keep this rank's values until wait_all() copies every sum back. The non-
// finite scan reads the staged copy and still names the rank's own first NaN.
TEST_P(GradBucketsTest, StagedBucketsSumInTheHostCopyAndComeBackAtWaitAll) {
  comm::MpiCommunicator data(MPI_COMM_WORLD, "data", 60.0);
  std::vector<float> g(kElements);
  GradBuckets buckets(data, g.data(), g.size(), kBucketBytes, GetParam(), tensor::ExecContext{},
                      /*stage_through_host=*/true);
  EXPECT_TRUE(buckets.staged());
  constexpr std::size_t kPoisoned = 3 * kElements / 4 + 5;  // in the third bucket sent
  for (int step = 0; step < 2; ++step) {
    for (std::size_t i = 0; i < g.size(); ++i)
      g[i] = value(i, world_rank());
    const bool poison = step == 1 && world_rank() == world_size() - 1;
    if (poison) g[kPoisoned] = std::numeric_limits<float>::quiet_NaN();
    buckets.reset();
    for (std::size_t k = 8; k-- > 0;)
      buckets.ready(k * (kElements / 8));
    if (world_size() > 1 && !poison) {
      for (std::size_t i = 0; i < g.size(); i += 997)
        ASSERT_EQ(g[i], value(i, world_rank())) << "summed in place before wait_all, at " << i;
    }
    buckets.wait_all();
    if (step == 0) {
      expect_sums(g);
      EXPECT_EQ(buckets.first_nonfinite_offset(), -1);
    } else {
      EXPECT_EQ(buckets.first_nonfinite_offset(),
                poison ? static_cast<std::int64_t>(kPoisoned) : -1);
      EXPECT_NE(g[kPoisoned], g[kPoisoned]) << "every rank's sum holds the NaN";
    }
  }
}

// parallel.backend shm: the gradients are the shared buffer; every bucket is summed in
// place there, several steps running, and with overlap the progress thread alone
// completes the buckets while the owner computes (the shared sum needs no MPI thread
// level). A NaN is still named by the rank that produced it.
TEST_P(GradBucketsTest, SharedMemoryBucketsSumInPlaceForSeveralSteps) {
  comm::MpiCommunicator data(MPI_COMM_WORLD, "data", 60.0);
  const bool overlap = GetParam();
  comm::SharedSum shared(data, kElements, GradBuckets::bucket_count_for(kElements, kBucketBytes));
  EXPECT_EQ(shared.slots(), 16u);
  GradBuckets buckets(shared, kBucketBytes, overlap);
  EXPECT_EQ(buckets.bucket_count(), 16u);
  EXPECT_EQ(buckets.progress_thread(), overlap && world_size() > 1);
  float* g = shared.local();
  constexpr std::size_t kPoisoned = kElements / 3;
  for (int step = 0; step < 3; ++step) {
    for (std::size_t i = 0; i < kElements; ++i)
      g[i] = value(i, world_rank());
    // Step 1 the last rank's gradient has an infinity, step 2 rank 0's: each step names
    // only its own (what an earlier step found is forgotten by reset()).
    const int poisoned_rank = step == 1 ? world_size() - 1 : step == 2 ? 0 : -1;
    const bool poison = world_rank() == poisoned_rank;
    if (poison) g[kPoisoned] = std::numeric_limits<float>::infinity();
    buckets.reset();
    for (std::size_t k = 8; k-- > 0;)
      buckets.ready(k * (kElements / 8));
    if (buckets.progress_thread()) {
      const auto t0 = std::chrono::steady_clock::now();
      while (buckets.completed() < buckets.bucket_count() &&
             std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30))
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      EXPECT_EQ(buckets.completed(), buckets.bucket_count()) << "step " << step;
    }
    buckets.wait_all();
    EXPECT_EQ(buckets.first_nonfinite_offset(), poison ? static_cast<std::int64_t>(kPoisoned) : -1);
    if (poisoned_rank < 0)
      expect_sums(std::vector<float>(g, g + kElements));
    else
      EXPECT_EQ(g[kPoisoned], std::numeric_limits<float>::infinity());
  }
}

// ZeRO: every bucket is reduce-scattered onto the ranks' shards (parts that cut through
// buckets, so a bucket's blocks go to one or two ranks): after wait_all() this rank's
// shard holds the sums. Stage 2 (release) returns the bucket's whole pages outside the
// shard as it completes, which read back as zeros; clear() zeroes the whole buffer the
// same way. A NaN is still named by the rank that produced it.
TEST_P(GradBucketsTest, ZeroBucketsReduceScatterOntoTheShards) {
  comm::MpiCommunicator data(MPI_COMM_WORLD, "data", 60.0);
  const ZeroShards shards = ZeroShards::by_parts(kElements, world_size());
  const std::size_t first = shards.first(world_rank()), last = shards.last(world_rank());
  // Page-aligned memory nobody has touched, as the trainer maps for stage 2.
  const std::size_t bytes = kElements * sizeof(float);
  void* mem = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  float* g = static_cast<float*>(mem);
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)) / sizeof(float);
  for (const bool release : {false, true}) {
    GradBuckets buckets(data, g, shards, kBucketBytes, GetParam(), release);
    EXPECT_EQ(buckets.bucket_count(), 16u);
    for (int step = 0; step < 2; ++step) {
      buckets.clear();
      for (std::size_t i = 0; i < kElements; i += 4099)
        ASSERT_EQ(g[i], 0.0f) << "cleared, at " << i;
      for (std::size_t i = 0; i < kElements; ++i)
        g[i] = value(i, world_rank());
      const bool poison = step == 1 && world_rank() == world_size() - 1;
      constexpr std::size_t kPoisoned = kElements / 2 + 3;
      if (poison) g[kPoisoned] = std::numeric_limits<float>::quiet_NaN();
      buckets.reset();
      for (std::size_t k = 8; k-- > 0;)
        buckets.ready(k * (kElements / 8));
      buckets.wait_all();
      EXPECT_EQ(buckets.first_nonfinite_offset(),
                poison ? static_cast<std::int64_t>(kPoisoned) : -1);
      for (std::size_t i = first; i < last; ++i) {
        if (i == kPoisoned && step == 1) continue;
        float want = 0.0f;
        for (int r = 0; r < world_size(); ++r)
          want += value(i, r);
        ASSERT_EQ(g[i], want) << "shard element " << i;
      }
      if (!release || world_size() == 1) continue;
      // Outside the shard, whole pages of 64 KiB buckets: released, zeros.
      for (std::size_t p = 0; p + page <= kElements; p += page) {
        const bool outside = p + page <= first || p >= last;
        if (outside) {
          ASSERT_EQ(g[p + 1], 0.0f) << "page at element " << p << " kept";
        }
      }
    }
  }
  ::munmap(mem, bytes);
}

TEST(GradBuckets, SharedMemoryNeedsASlotPerBucket) {
  comm::MpiCommunicator data(MPI_COMM_WORLD, "data", 60.0);
  comm::SharedSum shared(data, kElements, 15);
  EXPECT_THROW(GradBuckets(shared, kBucketBytes, true), Error);
}

std::string overlap_name(const ::testing::TestParamInfo<bool>& p) {
  return p.param ? "on" : "off";
}

INSTANTIATE_TEST_SUITE_P(Overlap, GradBucketsTest, ::testing::Bool(), overlap_name);

}  // namespace
}  // namespace dst::train
