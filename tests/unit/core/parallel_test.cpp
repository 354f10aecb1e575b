// core/parallel: the slices cover the range exactly once, respect the thread and size
// limits, and an exception from any slice reaches the caller after all have finished.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "core/parallel.hpp"

namespace {

using dst::core::parallel_slices;

std::vector<std::pair<std::uint64_t, std::uint64_t>> slices_of(std::uint64_t n, unsigned threads,
                                                               std::uint64_t min_slice) {
  std::mutex mu;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> got;
  parallel_slices(n, threads, min_slice, [&](std::uint64_t b, std::uint64_t e) {
    std::lock_guard<std::mutex> lock(mu);
    got.emplace_back(b, e);
  });
  std::sort(got.begin(), got.end());
  return got;
}

TEST(ParallelSlices, CoverTheRangeOnceWithinTheLimits) {
  for (const std::uint64_t n : {1ull, 2ull, 7ull, 100ull, 1000ull, 65537ull})
    for (const unsigned threads : {1u, 2u, 3u, 8u})
      for (const std::uint64_t min_slice : {1ull, 10ull, 1000ull}) {
        const auto got = slices_of(n, threads, min_slice);
        ASSERT_FALSE(got.empty());
        EXPECT_LE(got.size(), threads) << n << " " << threads << " " << min_slice;
        EXPECT_EQ(got.front().first, 0u);
        EXPECT_EQ(got.back().second, n);
        for (std::size_t i = 0; i < got.size(); ++i) {
          EXPECT_LT(got[i].first, got[i].second);  // none empty
          if (i > 0) {
            EXPECT_EQ(got[i].first, got[i - 1].second);  // contiguous, no overlap
          }
          if (got.size() > 1) {
            EXPECT_GE(got[i].second - got[i].first, min_slice);
          }
        }
      }
  EXPECT_TRUE(slices_of(0, 4, 1).empty());
  EXPECT_EQ(slices_of(1000, 4, 1).size(), 4u);
  EXPECT_EQ(slices_of(1000, 4, 400).size(), 2u);
}

TEST(ParallelSlices, RunsSlicesOnSeparateThreads) {
  std::mutex mu;
  std::set<std::thread::id> ids;
  parallel_slices(4, 4, 1, [&](std::uint64_t, std::uint64_t) {
    std::lock_guard<std::mutex> lock(mu);
    ids.insert(std::this_thread::get_id());
  });
  EXPECT_EQ(ids.size(), 4u);
  EXPECT_EQ(ids.count(std::this_thread::get_id()), 1u);  // the caller runs one
}

TEST(ParallelSlices, RethrowsAfterEverySliceHasRun) {
  std::atomic<int> ran{0};
  EXPECT_THROW(parallel_slices(8, 4, 1,
                               [&](std::uint64_t b, std::uint64_t) {
                                 ++ran;
                                 if (b == 4) throw std::runtime_error("slice 2 failed");
                               }),
               std::runtime_error);
  EXPECT_EQ(ran.load(), 4);
}

TEST(ParallelSlices, UsableCpusIsAtLeastOne) {
  EXPECT_GE(dst::core::usable_cpus(), 1u);
}

}  // namespace
