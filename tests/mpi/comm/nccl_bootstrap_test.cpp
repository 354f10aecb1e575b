// The MPI side of the NCCL back end (comm/nccl_bootstrap.hpp), on CPU: the unique id
// exchange over the world and over the data/tensor groups, a peer missing from it, and the
// deadline/abort logic of the init and collective waits against fake probes. NCCL itself
// is not involved, so this runs in every build.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "comm/mpi_communicator.hpp"
#include "comm/nccl_bootstrap.hpp"
#include "comm/process_groups.hpp"
#include "core/error.hpp"
#include "core/step_context.hpp"
#include "mpi_world.hpp"

namespace {

using dst::test::world_rank;
using dst::test::world_size;

using dst::DType;
using dst::comm::NcclUniqueIdBytes;
using dst::comm::ProbeResult;

using dst::test::kTestTimeoutS;
// How late a deadline may fire: the polls sleep at most 1 ms, but 4 ranks share 2 cores
// and a descheduled rank can lose a few hundred milliseconds.
constexpr double kLateMarginS = 0.7;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

/// A fake unique id: 128 bytes that depend on the group name and the world rank that made
/// it, all of them (a linear congruential sequence), so a comparison checks the content.
NcclUniqueIdBytes make_id(const std::string& group, int maker) {
  std::uint32_t x = 2166136261u;  // FNV-1a of the name, then the maker's rank
  for (char c : group)
    x = (x ^ static_cast<unsigned char>(c)) * 16777619u;
  x = (x ^ static_cast<std::uint32_t>(maker)) * 16777619u;
  NcclUniqueIdBytes id{};
  for (auto& b : id) {
    x = x * 1664525u + 1013904223u;  // Numerical Recipes LCG
    b = static_cast<char>(x >> 24);
  }
  return id;
}

/// What a rank other than the maker holds before the exchange: anything but the id.
NcclUniqueIdBytes junk_id(int rank) {
  NcclUniqueIdBytes id{};
  id.fill(static_cast<char>(0x5a ^ rank));
  return id;
}

TEST(UniqueIdExchange, WorldGetsRankZerosId) {
  auto world = dst::comm::make_mpi_communicator(MPI_COMM_WORLD, "world", kTestTimeoutS);
  const int rank = world->rank();
  NcclUniqueIdBytes id = rank == 0 ? make_id("world", 0) : junk_id(rank);
  dst::comm::exchange_unique_id(*world, id, kTestTimeoutS);
  EXPECT_EQ(id, make_id("world", 0)) << "rank " << rank;
}

dst::config::Layout layout_of(int data, int tensor) {
  dst::config::Layout l;
  l.data = data;
  l.tensor = tensor;
  l.pipeline = 1;
  l.world_size = data * tensor;
  return l;
}

/// Every data x tensor factorisation of the world (at 4 ranks: 4x1, 2x2, 1x4): each group
/// gets the id its own rank 0 made, and ranks of different groups get different ids.
TEST(UniqueIdExchange, EachGroupGetsItsOwnRankZerosId) {
  const int n = world_size();
  const int me = world_rank();
  for (int tensor = 1; tensor <= n; ++tensor) {
    if (n % tensor != 0) continue;
    const dst::config::Layout layout = layout_of(n / tensor, tensor);
    SCOPED_TRACE("layout data " + std::to_string(layout.data) + " x tensor " +
                 std::to_string(tensor));
    auto groups = dst::comm::make_process_groups(MPI_COMM_WORLD, layout, kTestTimeoutS);
    const dst::comm::RankCoords coords = dst::comm::rank_coords(me, layout);

    // Rank 0 of my data group has data coordinate 0; of my tensor group, tensor 0.
    const int data_root = dst::comm::world_rank_of({0, coords.tensor, 0}, layout);
    const int tensor_root = dst::comm::world_rank_of({coords.data, 0, 0}, layout);
    NcclUniqueIdBytes data_id = groups.data->rank() == 0 ? make_id("data", me) : junk_id(me);
    NcclUniqueIdBytes tensor_id = groups.tensor->rank() == 0 ? make_id("tensor", me) : junk_id(me);
    dst::comm::exchange_unique_id(*groups.data, data_id, kTestTimeoutS);
    dst::comm::exchange_unique_id(*groups.tensor, tensor_id, kTestTimeoutS);
    EXPECT_EQ(data_id, make_id("data", data_root)) << "world rank " << me;
    EXPECT_EQ(tensor_id, make_id("tensor", tensor_root)) << "world rank " << me;
    EXPECT_NE(data_id, tensor_id);

    // By content across the world: two ranks hold the same id exactly when they share
    // the group.
    const std::size_t b = data_id.size();
    std::vector<char> all_data(b * static_cast<std::size_t>(n));
    std::vector<char> all_tensor(b * static_cast<std::size_t>(n));
    groups.world->allgather(data_id.data(), all_data.data(), b, DType::u8);
    groups.world->allgather(tensor_id.data(), all_tensor.data(), b, DType::u8);
    for (int a = 0; a < n; ++a) {
      for (int c = 0; c < n; ++c) {
        const auto ca = dst::comm::rank_coords(a, layout);
        const auto cc = dst::comm::rank_coords(c, layout);
        const auto same = [&](const std::vector<char>& v) {
          return std::equal(v.begin() + a * b, v.begin() + (a + 1) * b, v.begin() + c * b);
        };
        EXPECT_EQ(same(all_data), ca.tensor == cc.tensor)
            << "data ids of world ranks " << a << " and " << c;
        EXPECT_EQ(same(all_tensor), ca.data == cc.data)
            << "tensor ids of world ranks " << a << " and " << c;
      }
    }
  }
}

/// The id's maker (group rank 0) is missing: every other rank must time out naming the
/// exchange and the group. (A missing non-root rank need not stall the others: MPI may
/// complete the root's broadcast as soon as its sends are buffered. That rank is then
/// caught by the deadline of ncclCommInitRankConfig, which needs every rank.)
TEST(UniqueIdExchange, MissingMakerMakesTheOthersThrowNamingTheGroup) {
  const int n = world_size();
  if (n < 2) GTEST_SKIP() << "needs a second rank to be missing";
  dst::core::set_current_step(dst::core::kStartupStep);
  // A communicator of its own: the timed-out broadcast stays pending on it (Request's
  // rules) until the late rank joins, and it progresses while everyone waits in the
  // barrier below. The id stays alive (static) meanwhile: MPI may still write into it.
  auto group = dst::comm::make_mpi_communicator(MPI_COMM_WORLD, "world", kTestTimeoutS);
  const int rank = group->rank();
  static NcclUniqueIdBytes id;
  id = rank == 0 ? make_id("late test", 0) : junk_id(rank);
  if (rank == 0) {
    // Absent for longer than the others' deadline, then joins so the job stays consistent.
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    dst::comm::exchange_unique_id(*group, id, kTestTimeoutS);
  } else {
    const double timeout_s = 0.5;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      dst::comm::exchange_unique_id(*group, id, timeout_s);
      ADD_FAILURE() << "the exchange completed although rank 0 (the maker) was absent";
    } catch (const dst::TimeoutError& e) {
      const double s = seconds_since(t0);
      EXPECT_GE(s, timeout_s);
      EXPECT_LT(s, timeout_s + kLateMarginS) << "the deadline fired late";
      const std::string m = e.what();
      EXPECT_TRUE(contains(
          m, "NCCL unique id exchange on group 'world' (" + std::to_string(n) + " ranks) failed"))
          << m;
      EXPECT_TRUE(contains(m, "did not complete within 0.5 s")) << m;
      EXPECT_TRUE(contains(m, "rank " + std::to_string(rank) + " waited")) << m;
      EXPECT_TRUE(contains(m, "nccl: unique id exchange on group 'world'"))
          << "the flight recorder report names the exchange:\n"
          << m;
    }
  }
  group->barrier();
}

TEST(WaitForInit, ReturnsOnceTheProbeIsReady) {
  int polls = 0;
  int aborts = 0;
  dst::comm::wait_for_init(
      [&] { return ++polls < 5 ? ProbeResult::pending() : ProbeResult::ready(); }, kTestTimeoutS,
      "data", 2, [&] { ++aborts; });
  EXPECT_EQ(polls, 5);
  EXPECT_EQ(aborts, 0);
}

TEST(WaitForInit, NoDeadlineWaitsUntilReady) {
  int polls = 0;
  dst::comm::wait_for_init(
      [&] { return ++polls < 50 ? ProbeResult::pending() : ProbeResult::ready(); }, 0.0, "world", 1,
      {});
  EXPECT_EQ(polls, 50);
}

TEST(WaitForInit, NeverReadyAbortsOnceAndNamesGroupAndCallWithinTheDeadline) {
  dst::core::set_current_step(dst::core::kStartupStep);
  int polls = 0;
  int aborts = 0;
  const double timeout_s = 0.3;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    dst::comm::wait_for_init(
        [&] {
          ++polls;
          return ProbeResult::pending();
        },
        timeout_s, "tensor", 4, [&] { ++aborts; });
    FAIL() << "wait_for_init returned although the probe never became ready";
  } catch (const dst::TimeoutError& e) {
    const double s = seconds_since(t0);
    EXPECT_GE(s, timeout_s);
    EXPECT_LT(s, timeout_s + kLateMarginS) << "the deadline fired late";
    const std::string m = e.what();
    EXPECT_TRUE(contains(
        m, "ncclCommInitRankConfig on group 'tensor' (4 ranks) did not complete within 0.3 s"))
        << m;
    EXPECT_TRUE(contains(m, "start-up")) << m;
    EXPECT_TRUE(contains(m, "the communicator was aborted")) << m;
  }
  EXPECT_EQ(aborts, 1);
  EXPECT_GT(polls, 1) << "the probe is polled, not asked once";
}

TEST(WaitForInit, ProbeErrorAbortsAndCarriesTheNcclText) {
  int polls = 0;
  int aborts = 0;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    dst::comm::wait_for_init(
        [&] {
          return ++polls < 3 ? ProbeResult::pending()
                             : ProbeResult::failed(
                                   "remote process exited or there was a "
                                   "network error (NCCL: socket closed)");
        },
        kTestTimeoutS, "data", 2, [&] { ++aborts; });
    FAIL() << "wait_for_init returned although the probe reported an error";
  } catch (const dst::TimeoutError& e) {
    FAIL() << "an error is not a timeout: " << e.what();
  } catch (const dst::Error& e) {
    const std::string m = e.what();
    EXPECT_TRUE(contains(m,
                         "ncclCommInitRankConfig on group 'data' (2 ranks) failed: remote "
                         "process exited or there was a network error (NCCL: socket closed)"))
        << m;
    EXPECT_TRUE(contains(m, "the communicator was aborted")) << m;
  }
  EXPECT_EQ(aborts, 1);
  EXPECT_EQ(polls, 3);
  EXPECT_LT(seconds_since(t0), 5.0) << "an error must end the wait at once, not at the deadline";
}

TEST(WaitForInit, FailingAbortIsReportedWithTheOriginalError) {
  try {
    dst::comm::wait_for_init([] { return ProbeResult::failed("internal error"); }, kTestTimeoutS,
                             "pipeline", 2,
                             [] { throw dst::Error("ncclCommAbort: invalid usage"); });
    FAIL() << "wait_for_init returned although the probe reported an error";
  } catch (const dst::Error& e) {
    const std::string m = e.what();
    EXPECT_TRUE(contains(m, "group 'pipeline' (2 ranks) failed: internal error")) << m;
    EXPECT_TRUE(contains(m, "aborting it failed too: ncclCommAbort: invalid usage")) << m;
  }
}

TEST(WaitForCollective, NeverCompletingAbortsOnceAndNamesTheCollectiveAndStep) {
  dst::core::set_current_step(7);
  int aborts = 0;
  const double timeout_s = 0.2;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    dst::comm::wait_for_collective(
        [] { return ProbeResult::pending(); }, timeout_s,
        [] {
          return std::string("nccl: allreduce(sum) of 8 x f32 (32 B) on group 'data' (2 ranks)");
        },
        [&] { ++aborts; });
    FAIL() << "wait_for_collective returned although the probe never became ready";
  } catch (const dst::TimeoutError& e) {
    const double s = seconds_since(t0);
    EXPECT_GE(s, timeout_s);
    EXPECT_LT(s, timeout_s + kLateMarginS) << "the deadline fired late";
    const std::string m = e.what();
    EXPECT_TRUE(contains(m,
                         "nccl: allreduce(sum) of 8 x f32 (32 B) on group 'data' (2 ranks) "
                         "did not complete within 0.2 s at step 7"))
        << m;
    EXPECT_TRUE(contains(m, "rank " + std::to_string(world_rank()) + " waited")) << m;
  }
  dst::core::set_current_step(dst::core::kStartupStep);
  EXPECT_EQ(aborts, 1);
}

TEST(WaitForCollective, AsyncErrorAbortsAndNamesIt) {
  int aborts = 0;
  try {
    dst::comm::wait_for_collective(
        [] { return ProbeResult::failed("unhandled cuda error"); }, kTestTimeoutS,
        [] { return std::string("nccl: barrier on group 'tensor' (4 ranks)"); }, [&] { ++aborts; });
    FAIL() << "wait_for_collective returned although the probe reported an error";
  } catch (const dst::TimeoutError& e) {
    FAIL() << "an error is not a timeout: " << e.what();
  } catch (const dst::Error& e) {
    EXPECT_TRUE(contains(e.what(),
                         "nccl: barrier on group 'tensor' (4 ranks) failed: unhandled "
                         "cuda error"))
        << e.what();
  }
  EXPECT_EQ(aborts, 1);
}

TEST(WaitForCollective, CompletesWithoutAborting) {
  int polls = 0;
  int aborts = 0;
  dst::comm::wait_for_collective(
      [&] { return ++polls < 3 ? ProbeResult::pending() : ProbeResult::ready(); }, kTestTimeoutS,
      [] { return std::string("unused"); }, [&] { ++aborts; });
  EXPECT_EQ(polls, 3);
  EXPECT_EQ(aborts, 0);
}

}  // namespace
