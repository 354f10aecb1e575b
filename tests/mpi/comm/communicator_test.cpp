// Collectives of MpiCommunicator against serial references. Every rank generates its
// inputs from (rank, index), so every rank can compute the expected result of all ranks
// locally. Float inputs are small integers: their sums are exact in f32/f64 at these
// sizes (< 2^24), so results compare with EXPECT_EQ.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <thread>
#include <type_traits>
#include <vector>

#include "comm/mpi_communicator.hpp"
#include "core/error.hpp"
#include "core/step_context.hpp"
#include "mpi_world.hpp"

namespace {

using dst::DType;
using dst::comm::Communicator;
using dst::comm::ReduceOp;
using dst::comm::Request;

using dst::test::kTestTimeoutS;

std::unique_ptr<Communicator> world_comm(double timeout_s = kTestTimeoutS) {
  return dst::comm::make_mpi_communicator(MPI_COMM_WORLD, "world", timeout_s);
}

/// Input element i of `rank`: small integers of both signs (for signed types), with
/// values that cross between ranks so max and min pick different ranks per element. The
/// 64-bit integer types get an offset beyond 32 bits to show no narrowing happens.
template <class T>
T input(int rank, std::size_t i) {
  const long long base = static_cast<long long>((rank * 7 + static_cast<int>(i) * 3) % 11);
  long long v = std::is_signed<T>::value ? base - 5 : base;
  if constexpr (std::is_integral<T>::value && sizeof(T) == 8) v += (1LL << 40);
  return static_cast<T>(v);
}

template <class T>
T reference(ReduceOp op, int nranks, std::size_t i) {
  T acc = input<T>(0, i);
  for (int r = 1; r < nranks; ++r) {
    const T v = input<T>(r, i);
    acc = op == ReduceOp::sum   ? static_cast<T>(acc + v)
          : op == ReduceOp::max ? std::max(acc, v)
                                : std::min(acc, v);
  }
  return acc;
}

template <class T>
class AllreduceTyped : public ::testing::Test {};
using ReduceTypes = ::testing::Types<float, double, std::int32_t, std::int64_t, std::uint64_t>;
TYPED_TEST_SUITE(AllreduceTyped, ReduceTypes);

TYPED_TEST(AllreduceTyped, SumMaxMinMatchSerialReference) {
  using T = TypeParam;
  auto comm = world_comm();
  const int rank = comm->rank();
  const int n = comm->size();
  for (const std::size_t count : {std::size_t{1}, std::size_t{1000}}) {
    for (const ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
      std::vector<T> buf(count);
      for (std::size_t i = 0; i < count; ++i)
        buf[i] = input<T>(rank, i);
      comm->allreduce(buf.data(), count, op);
      for (std::size_t i = 0; i < count; ++i)
        ASSERT_EQ(buf[i], reference<T>(op, n, i))
            << "op " << dst::comm::reduce_op_name(op) << " count " << count << " i " << i;
    }
  }
  EXPECT_EQ(comm->allreduce_value<T>(input<T>(rank, 3), ReduceOp::max),
            reference<T>(ReduceOp::max, n, 3));
}

TEST(Communicator, ReportsGroupShape) {
  auto comm = world_comm();
  int rank = -1, size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(comm->rank(), rank);
  EXPECT_EQ(comm->size(), size);
  EXPECT_EQ(comm->name(), "world");
  EXPECT_EQ(comm->timeout_s(), kTestTimeoutS);
  // A private duplicate: same group, different context.
  int cmp = -1;
  MPI_Comm_compare(dst::comm::mpi_comm_of(*comm), MPI_COMM_WORLD, &cmp);
  EXPECT_EQ(cmp, MPI_CONGRUENT);
}

TEST(Communicator, ReduceScatterGivesEachRankItsReducedBlock) {
  auto comm = world_comm();
  const int rank = comm->rank();
  const int n = comm->size();
  const std::size_t block = 37;
  const std::size_t total = block * static_cast<std::size_t>(n);
  std::vector<float> send(total);
  for (std::size_t i = 0; i < total; ++i)
    send[i] = input<float>(rank, i);

  std::vector<float> recv(block, -1.0f);
  comm->reduce_scatter(send.data(), recv.data(), block, DType::f32, ReduceOp::sum);
  for (std::size_t i = 0; i < block; ++i)
    ASSERT_EQ(recv[i], reference<float>(ReduceOp::sum, n, rank * block + i)) << "i " << i;

  std::vector<std::int64_t> send64(total);
  for (std::size_t i = 0; i < total; ++i)
    send64[i] = input<std::int64_t>(rank, i);
  std::vector<std::int64_t> recv64(block);
  comm->reduce_scatter(send64.data(), recv64.data(), block, DType::i64, ReduceOp::max);
  for (std::size_t i = 0; i < block; ++i)
    ASSERT_EQ(recv64[i], reference<std::int64_t>(ReduceOp::max, n, rank * block + i));

  // In place (send == recv): the result lands in the first block.
  std::vector<float> inplace = send;
  comm->reduce_scatter(inplace.data(), inplace.data(), block, DType::f32, ReduceOp::min);
  for (std::size_t i = 0; i < block; ++i)
    ASSERT_EQ(inplace[i], reference<float>(ReduceOp::min, n, rank * block + i));
}

TEST(Communicator, AllgatherOrdersBlocksByRank) {
  auto comm = world_comm();
  const int rank = comm->rank();
  const int n = comm->size();
  const std::size_t count = 53;
  std::vector<double> send(count);
  for (std::size_t i = 0; i < count; ++i)
    send[i] = input<double>(rank, i) + 100.0 * rank;
  std::vector<double> recv(count * n, -1.0);
  comm->allgather(send.data(), recv.data(), count, DType::f64);
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < count; ++i)
      ASSERT_EQ(recv[r * count + i], input<double>(r, i) + 100.0 * r) << "r " << r << " i " << i;

  // bf16 moves as 16-bit words: any bit pattern, NaN payloads included, arrives intact.
  std::vector<std::uint16_t> bits(count), gathered(count * n);
  for (std::size_t i = 0; i < count; ++i)
    bits[i] = static_cast<std::uint16_t>(0x7fc1 + rank * 131 + i);
  comm->allgather(bits.data(), gathered.data(), count, DType::bf16);
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < count; ++i)
      ASSERT_EQ(gathered[r * count + i], static_cast<std::uint16_t>(0x7fc1 + r * 131 + i));
}

/// Blocks of unequal sizes for `n` ranks, some empty: rank r gets (r * 29 + 3) % 41, and
/// rank 1 (when there is one) nothing.
std::vector<std::size_t> uneven_counts(int n) {
  std::vector<std::size_t> c;
  for (int r = 0; r < n; ++r)
    c.push_back(r == 1 ? 0 : static_cast<std::size_t>((r * 29 + 3) % 41));
  return c;
}

TEST(Communicator, ReduceScatterOfUnequalBlocksLeavesEachRankItsBlockInPlace) {
  auto comm = world_comm();
  const int rank = comm->rank();
  const int n = comm->size();
  const auto counts = uneven_counts(n);
  std::size_t total = 0, at = 0;
  for (int r = 0; r < n; ++r) {
    if (r == rank) at = total;
    total += counts[static_cast<std::size_t>(r)];
  }
  std::vector<float> buf(total);
  for (std::size_t i = 0; i < total; ++i)
    buf[i] = input<float>(rank, i);
  comm->ireduce_scatter_blocks(buf.data(), counts, DType::f32, ReduceOp::sum).wait();
  for (std::size_t i = at; i < at + counts[static_cast<std::size_t>(rank)]; ++i)
    ASSERT_EQ(buf[i], reference<float>(ReduceOp::sum, n, i)) << "i " << i;
  // The same counts on every rank are required: a wrong number of them is refused.
  EXPECT_THROW(comm->ireduce_scatter_blocks(buf.data(), std::vector<std::size_t>(n + 1, 0),
                                            DType::f32, ReduceOp::sum),
               dst::Error);
}

// What ZeRO relies on for bit-identical stages (docs/performance.md, "ZeRO"): Open MPI
// 4.1's non-blocking reduce-scatter of a rank's block sums in the order of its in-place
// non-blocking all-reduce, so floats that round differently in other orders give the
// same bits both ways (at 1, 2 and 4 ranks; sizes that pick different algorithms).
TEST(Communicator, ReduceScatterOfBlocksSumsInTheOrderOfAllreduce) {
  auto comm = world_comm();
  const int rank = comm->rank();
  const int n = comm->size();
  for (const std::size_t total : {std::size_t{1000}, std::size_t{100003}, std::size_t{1} << 20}) {
    std::vector<float> a(total);
    std::uint32_t x = 2463534242u + static_cast<std::uint32_t>(rank) * 7919u;
    for (auto& v : a) {  // xorshift: values of many magnitudes and both signs
      x ^= x << 13;
      x ^= x >> 17;
      x ^= x << 5;
      v = (static_cast<float>(x % 20001) - 10000.0f) * std::ldexp(1.0f, static_cast<int>(x % 23));
    }
    std::vector<float> all = a;
    comm->allreduce(all.data(), total, DType::f32, ReduceOp::sum);
    // Blocks: every rank's share of the range, and a layout where one rank gets it all.
    std::vector<std::size_t> even(n), one(n, 0);
    for (int r = 0; r < n; ++r)
      even[r] = total * (r + 1) / n - total * r / n;
    one[n - 1] = total;
    for (const auto& counts : {even, one}) {
      std::vector<float> rs = a;
      comm->ireduce_scatter_blocks(rs.data(), counts, DType::f32, ReduceOp::sum).wait();
      std::size_t at = 0;
      for (int r = 0; r < rank; ++r)
        at += counts[r];
      ASSERT_EQ(std::memcmp(rs.data() + at, all.data() + at, counts[rank] * sizeof(float)), 0)
          << total << " elements at " << n << " ranks";
    }
  }
}

TEST(Communicator, AllgatherOfUnequalBlocksInPlace) {
  auto comm = world_comm();
  const int rank = comm->rank();
  const int n = comm->size();
  const auto counts = uneven_counts(n);
  std::size_t total = 0;
  for (const auto c : counts)
    total += c;
  std::vector<float> buf(total, -1.0f);
  std::size_t at = 0;
  for (int r = 0; r < n; ++r) {
    for (std::size_t i = 0; i < counts[static_cast<std::size_t>(r)]; ++i)
      if (r == rank) buf[at + i] = static_cast<float>(1000 * r) + static_cast<float>(i);
    at += counts[static_cast<std::size_t>(r)];
  }
  Request req = comm->iallgather_blocks(buf.data(), counts, DType::f32);
  req.wait();
  at = 0;
  for (int r = 0; r < n; ++r) {
    for (std::size_t i = 0; i < counts[static_cast<std::size_t>(r)]; ++i)
      ASSERT_EQ(buf[at + i], static_cast<float>(1000 * r) + static_cast<float>(i));
    at += counts[static_cast<std::size_t>(r)];
  }
}

TEST(Communicator, BroadcastFromEveryRoot) {
  auto comm = world_comm();
  const int rank = comm->rank();
  for (int root = 0; root < comm->size(); ++root) {
    std::vector<std::int32_t> buf(65, -7);
    if (rank == root)
      for (std::size_t i = 0; i < buf.size(); ++i)
        buf[i] = input<std::int32_t>(root, i) + root;
    comm->broadcast(buf.data(), buf.size(), DType::i32, root);
    for (std::size_t i = 0; i < buf.size(); ++i)
      ASSERT_EQ(buf[i], input<std::int32_t>(root, i) + root) << "root " << root << " i " << i;
  }
}

TEST(Communicator, BarrierCompletes) {
  auto comm = world_comm();
  comm->barrier();
  Request r = comm->ibarrier();
  r.wait();
  EXPECT_FALSE(r.valid());
}

TEST(Communicator, SeveralNonBlockingRequestsInFlight) {
  auto comm = world_comm();
  const int rank = comm->rank();
  const int n = comm->size();
  const std::size_t count = 4096;
  std::vector<float> a(count), b(count);
  std::vector<std::int64_t> c(count);
  std::vector<std::uint64_t> gathered(static_cast<std::size_t>(n));
  const std::uint64_t mine = 1000u + static_cast<std::uint64_t>(rank);
  std::vector<double> bc(9, rank == n - 1 ? 2.5 : 0.0);
  for (std::size_t i = 0; i < count; ++i) {
    a[i] = input<float>(rank, i);
    b[i] = input<float>(rank, i + 1);
    c[i] = input<std::int64_t>(rank, i);
  }

  std::vector<Request> reqs;
  reqs.push_back(comm->iallreduce(a.data(), count, DType::f32, ReduceOp::sum));
  reqs.push_back(comm->iallreduce(b.data(), count, DType::f32, ReduceOp::max));
  reqs.push_back(comm->iallreduce(c.data(), count, DType::i64, ReduceOp::min));
  reqs.push_back(comm->iallgather(&mine, gathered.data(), 1, DType::u64));
  reqs.push_back(comm->ibroadcast(bc.data(), bc.size(), DType::f64, n - 1));
  reqs.push_back(comm->ibarrier());

  // Progress comes only from polling (no asynchronous progress in Open MPI here).
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  bool all_done = false;
  while (!all_done && std::chrono::steady_clock::now() < give_up) {
    all_done = true;
    for (auto& r : reqs)
      all_done = r.test() && all_done;
  }
  ASSERT_TRUE(all_done) << "requests did not complete by polling test()";
  // wait() after a successful test() returns at once and empties the request.
  for (auto& r : reqs) {
    EXPECT_TRUE(r.valid());
    r.wait();
    EXPECT_FALSE(r.valid());
  }
  for (std::size_t i = 0; i < count; ++i) {
    ASSERT_EQ(a[i], reference<float>(ReduceOp::sum, n, i));
    ASSERT_EQ(b[i], reference<float>(ReduceOp::max, n, i + 1));
    ASSERT_EQ(c[i], reference<std::int64_t>(ReduceOp::min, n, i));
  }
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(gathered[r], 1000u + static_cast<std::uint64_t>(r));
  for (double v : bc)
    EXPECT_EQ(v, 2.5);
}

TEST(Communicator, WaitInReverseOrderOfStart) {
  auto comm = world_comm();
  const int n = comm->size();
  std::vector<std::vector<std::int32_t>> bufs(5, std::vector<std::int32_t>(300, 1));
  std::vector<Request> reqs;
  for (auto& b : bufs)
    reqs.push_back(comm->iallreduce(b.data(), b.size(), DType::i32, ReduceOp::sum));
  for (auto it = reqs.rbegin(); it != reqs.rend(); ++it)
    it->wait();
  for (auto& b : bufs)
    for (auto v : b)
      ASSERT_EQ(v, n);
}

TEST(Request, WaitTwiceIsAnErrorAndEmptyRequestTestsTrue) {
  auto comm = world_comm();
  Request r = comm->ibarrier();
  r.wait();
  EXPECT_THROW(r.wait(), dst::Error);
  Request empty;
  EXPECT_FALSE(empty.valid());
  EXPECT_TRUE(empty.test());
  EXPECT_THROW(empty.wait(), dst::Error);
}

TEST(Request, DestroyingAnUnwaitedRequestCompletesIt) {
  auto comm = world_comm();
  const int n = comm->size();
  std::vector<std::int32_t> buf(100, 2);
  { Request r = comm->iallreduce(buf.data(), buf.size(), DType::i32, ReduceOp::sum); }
  for (auto v : buf)
    ASSERT_EQ(v, 2 * n);

  // Move-assigning over a pending request completes the old one first.
  std::vector<std::int32_t> first(10, 1), second(10, 3);
  Request r = comm->iallreduce(first.data(), first.size(), DType::i32, ReduceOp::sum);
  r = comm->iallreduce(second.data(), second.size(), DType::i32, ReduceOp::sum);
  for (auto v : first)
    ASSERT_EQ(v, n);
  r.wait();
  for (auto v : second)
    ASSERT_EQ(v, 3 * n);
}

TEST(Request, UnwindingDoesNotWaitForAPendingRequest) {
  auto comm = world_comm();
  const int rank = comm->rank();
  // Rank 1 joins the barrier late; rank 0's request is destroyed by an exception in the
  // meantime and must not wait for it (it would add a deadline to an error's way out).
  if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  const auto t0 = std::chrono::steady_clock::now();
  try {
    Request r = comm->ibarrier();
    throw std::runtime_error("error while a collective is in flight");
  } catch (const std::runtime_error&) {
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (rank == 0 && comm->size() > 1) {
    EXPECT_LT(s, 0.5) << "the destructor waited";
  }
  // The abandoned barrier still completes inside MPI; a second one re-synchronises.
  comm->barrier();
}

TEST(Communicator, RejectsWhatMpiCannotDo) {
  auto comm = world_comm();
  std::vector<std::uint16_t> bf16(8, 0);
  try {
    comm->allreduce(bf16.data(), bf16.size(), DType::bf16, ReduceOp::sum);
    FAIL() << "bf16 allreduce did not throw";
  } catch (const dst::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("allreduce(sum) of 8 x bf16 (16 B)"), std::string::npos) << m;
    EXPECT_NE(m.find("reduce in f32"), std::string::npos) << m;
  }
  std::vector<std::uint16_t> recv(8 * comm->size());
  EXPECT_THROW(comm->reduce_scatter(recv.data(), bf16.data(), 8, DType::f16, ReduceOp::max),
               dst::Error);
  EXPECT_THROW(comm->broadcast(bf16.data(), 8, DType::bf16, comm->size()), dst::Error);
  EXPECT_THROW(comm->broadcast(bf16.data(), 8, DType::bf16, -1), dst::Error);
}

TEST(Timeout, LateRankMakesTheWaiterThrowNamingTheCollective) {
  auto comm = world_comm();
  if (comm->size() < 2) GTEST_SKIP() << "needs a second rank to be late";
  dst::core::set_current_step(dst::core::kStartupStep);
  const int rank = comm->rank();
  const std::size_t count = 4096;
  std::vector<float> buf(count, 1.0f);
  if (rank == 0) {
    comm->set_timeout_s(0.5);
    Request r = comm->iallreduce(buf.data(), count, DType::f32, ReduceOp::sum);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      r.wait();
      FAIL() << "wait() returned although rank 1 joins only after 1.5 s";
    } catch (const dst::TimeoutError& e) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      EXPECT_GE(s, 0.5);
      EXPECT_LT(s, 1.4) << "the deadline fired late";
      const std::string m = e.what();
      EXPECT_NE(m.find("allreduce(sum) of 4096 x f32 (16384 B) on group 'world'"),
                std::string::npos)
          << m;
      EXPECT_NE(m.find("did not complete within 0.5 s"), std::string::npos) << m;
      EXPECT_NE(m.find("start-up"), std::string::npos) << m;
      EXPECT_NE(m.find("rank 0"), std::string::npos) << m;
    }
    // The request is still pending after the timeout; finishing it without a deadline
    // leaves both ranks consistent for the next test.
    ASSERT_TRUE(r.valid());
    r.wait_for(0.0);
    EXPECT_FALSE(r.valid());
  } else {
    if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    comm->allreduce(buf.data(), count, DType::f32, ReduceOp::sum);
  }
  for (float v : buf)
    ASSERT_EQ(v, static_cast<float>(comm->size()));
  comm->barrier();
}

// The collectives of ZeRO have the communicator's deadline too, and their message says
// what they are.
TEST(Timeout, ReduceScatterOfBlocksHasTheDeadline) {
  auto comm = world_comm();
  if (comm->size() < 2) GTEST_SKIP() << "needs a second rank to be late";
  const int n = comm->size();
  const std::vector<std::size_t> counts(n, 100);
  std::vector<float> buf(100 * static_cast<std::size_t>(n), 1.0f);
  if (comm->rank() == 0) {
    comm->set_timeout_s(0.3);
    Request r = comm->ireduce_scatter_blocks(buf.data(), counts, DType::f32, ReduceOp::sum);
    try {
      r.wait();
      FAIL() << "wait() returned although rank 1 joins only after 1 s";
    } catch (const dst::TimeoutError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("reduce_scatter(sum) of " + std::to_string(100 * n) + " x f32"),
                std::string::npos)
          << m;
      EXPECT_NE(m.find("in blocks of unequal sizes, 100 to this rank"), std::string::npos) << m;
    }
    r.wait_for(0.0);
  } else {
    if (comm->rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    comm->ireduce_scatter_blocks(buf.data(), counts, DType::f32, ReduceOp::sum).wait();
  }
  comm->barrier();
}

// Expert parallelism's exchanges: rank r sends (r + 1) * (q + 1) elements to rank q, but
// none from rank 0 to the last rank (an empty block); then the all-to-all of counts.
TEST(Communicator, AlltoallvDeliversBlocksOfUnequalSizesByRank) {
  auto comm = world_comm();
  const int n = comm->size(), me = comm->rank();
  std::vector<std::size_t> send_counts(n), recv_counts(n);
  std::vector<float> send;
  for (int q = 0; q < n; ++q) {
    // Rank 0 sends nothing to the last rank: an empty block.
    send_counts[q] =
        (me == 0 && q == n - 1 && n > 1) ? 0 : static_cast<std::size_t>((me + 1) * (q + 1));
    recv_counts[q] =
        (q == 0 && me == n - 1 && n > 1) ? 0 : static_cast<std::size_t>((q + 1) * (me + 1));
    for (std::size_t i = 0; i < send_counts[q]; ++i)
      send.push_back(static_cast<float>(1000 * me + 10 * q) + static_cast<float>(i));
  }
  std::size_t total = 0;
  for (const std::size_t c : recv_counts)
    total += c;
  std::vector<float> recv(total, -1.0f);
  comm->ialltoallv(send.data(), send_counts, recv.data(), recv_counts, DType::f32).wait();
  std::size_t at = 0;
  for (int q = 0; q < n; ++q)
    for (std::size_t i = 0; i < recv_counts[q]; ++i)
      ASSERT_EQ(recv[at++], static_cast<float>(1000 * q + 10 * me) + static_cast<float>(i))
          << "from rank " << q;
  // The counts exchange: count_per_rank values to each rank.
  std::vector<std::int64_t> cs(2 * static_cast<std::size_t>(n)), cr(cs.size(), -1);
  for (int q = 0; q < n; ++q) {
    cs[2 * q] = 100 * me + q;
    cs[2 * q + 1] = 0;
  }
  comm->ialltoall(cs.data(), cr.data(), 2, DType::i64).wait();
  for (int q = 0; q < n; ++q) {
    EXPECT_EQ(cr[2 * q], 100 * q + me);
    EXPECT_EQ(cr[2 * q + 1], 0);
  }
}

TEST(Timeout, AlltoallvNamesItselfWhenAPeerHangs) {
  auto comm = world_comm();
  if (comm->size() < 2) GTEST_SKIP() << "needs a second rank to be late";
  const int n = comm->size();
  const std::vector<std::size_t> counts(n, 8);
  std::vector<float> send(8 * static_cast<std::size_t>(n), 1.0f), recv(send.size());
  if (comm->rank() == 0) {
    comm->set_timeout_s(0.3);
    Request r = comm->ialltoallv(send.data(), counts, recv.data(), counts, DType::f32);
    try {
      r.wait();
      FAIL() << "wait() returned although rank 1 joins only after 1 s";
    } catch (const dst::TimeoutError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("alltoallv of " + std::to_string(8 * n) + " x f32"), std::string::npos) << m;
      EXPECT_NE(m.find("on group 'world'"), std::string::npos) << m;
    }
    r.wait_for(0.0);
  } else {
    if (comm->rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    comm->ialltoallv(send.data(), counts, recv.data(), counts, DType::f32).wait();
  }
  comm->barrier();
}

TEST(Timeout, MessageNamesTheTrainingStep) {
  auto comm = world_comm();
  if (comm->size() < 2) GTEST_SKIP() << "needs a second rank to be late";
  const int rank = comm->rank();
  dst::core::set_current_step(7);
  std::int64_t v = 1;
  if (rank == 0) {
    comm->set_timeout_s(0.2);
    Request r = comm->ibroadcast(&v, 1, DType::i64, 1);
    try {
      r.wait();
      FAIL() << "wait() returned although rank 1 joins only after 0.6 s";
    } catch (const dst::TimeoutError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("broadcast from rank 1 of 1 x i64 (8 B)"), std::string::npos) << m;
      EXPECT_NE(m.find("at step 7"), std::string::npos) << m;
    }
    r.wait_for(0.0);
  } else {
    if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(600));
    v = 42;
    comm->broadcast(&v, 1, DType::i64, 1);
  }
  dst::core::set_current_step(dst::core::kStartupStep);
  EXPECT_EQ(v, 42);
}

}  // namespace
