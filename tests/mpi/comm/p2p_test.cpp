// Point-to-point sends and receives of MpiCommunicator (pipeline stages' activations and
// their gradients): data arrives whole and in order per tag, a ring of neighbours works
// with every send posted before its receive, peers are checked, and a receive whose
// sender is late ends at the deadline with a message naming the operation and the peer.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "comm/mpi_communicator.hpp"
#include "core/error.hpp"
#include "core/step_context.hpp"
#include "mpi_world.hpp"

namespace {

using dst::DType;
using dst::comm::Communicator;
using dst::comm::Request;

using dst::test::kTestTimeoutS;

std::unique_ptr<Communicator> pipeline_comm() {
  return dst::comm::make_mpi_communicator(MPI_COMM_WORLD, "pipeline", kTestTimeoutS);
}

float value(int from, int tag, std::size_t i) {
  return static_cast<float>(from * 100000 + tag * 1000 + static_cast<int>(i % 997));
}

// Rank r sends two messages (tags 0 and 1, the second large enough for a rendezvous
// protocol) to r + 1 and receives r - 1's, as neighbouring stages do; receives are posted
// in the opposite tag order to show tags, not arrival, match them.
TEST(PointToPoint, RingOfNeighboursByTag) {
  auto comm = pipeline_comm();
  const int n = comm->size();
  if (n < 2) GTEST_SKIP() << "needs two ranks";
  const int rank = comm->rank();
  const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  const std::size_t counts[2] = {17, 1 << 18};
  std::vector<std::vector<float>> out(2), in(2);
  std::vector<Request> requests;
  for (int tag = 0; tag < 2; ++tag) {
    out[tag].resize(counts[tag]);
    for (std::size_t i = 0; i < counts[tag]; ++i)
      out[tag][i] = value(rank, tag, i);
    requests.push_back(comm->isend(out[tag].data(), counts[tag], DType::f32, next, tag));
  }
  for (int tag = 1; tag >= 0; --tag) {
    in[tag].assign(counts[tag], -1.0f);
    requests.push_back(comm->irecv(in[tag].data(), counts[tag], DType::f32, prev, tag));
  }
  for (auto& r : requests)
    r.wait();
  for (int tag = 0; tag < 2; ++tag)
    for (std::size_t i = 0; i < counts[tag]; ++i)
      ASSERT_EQ(in[tag][i], value(prev, tag, i)) << "tag " << tag << " element " << i;
  comm->barrier();
}

TEST(PointToPoint, RefusesABadPeer) {
  auto comm = pipeline_comm();
  float x = 0.0f;
  EXPECT_THROW(comm->isend(&x, 1, DType::f32, comm->rank(), 0), dst::Error);
  EXPECT_THROW(comm->irecv(&x, 1, DType::f32, comm->size(), 0), dst::Error);
  EXPECT_THROW(comm->irecv(&x, 1, DType::f32, -1, 0), dst::Error);
  try {
    comm->isend(&x, 1, DType::f32, comm->rank(), 3);
  } catch (const dst::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("send (tag 3) of 1 x f32"), std::string::npos) << m;
    EXPECT_NE(m.find("another rank of the group"), std::string::npos) << m;
  }
}

// Rank 1 sends only after 1.5 s; rank 0's receive has a 0.5 s deadline: it throws a
// TimeoutError naming the receive, its size, the peer and the group, then completes.
TEST(PointToPoint, LateSenderMakesTheReceiverThrowNamingThePeer) {
  auto comm = pipeline_comm();
  if (comm->size() < 2) GTEST_SKIP() << "needs a second rank to be late";
  dst::core::set_current_step(dst::core::kStartupStep);
  const std::size_t count = 4096;
  std::vector<float> buf(count, 0.0f);
  if (comm->rank() == 0) {
    comm->set_timeout_s(0.5);
    Request r = comm->irecv(buf.data(), count, DType::f32, 1, 7);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      r.wait();
      FAIL() << "wait() returned although rank 1 sends only after 1.5 s";
    } catch (const dst::TimeoutError& e) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      EXPECT_GE(s, 0.5);
      EXPECT_LT(s, 1.4) << "the deadline fired late";
      const std::string m = e.what();
      EXPECT_NE(m.find("recv (tag 7) of 4096 x f32 (16384 B) from rank 1 on group 'pipeline'"),
                std::string::npos)
          << m;
      EXPECT_NE(m.find("did not complete within 0.5 s"), std::string::npos) << m;
    }
    ASSERT_TRUE(r.valid());
    r.wait_for(0.0);
    for (float v : buf)
      ASSERT_EQ(v, 1.0f);
  } else if (comm->rank() == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    std::vector<float> ones(count, 1.0f);
    comm->isend(ones.data(), count, DType::f32, 0, 7).wait();
  }
  comm->barrier();
}

}  // namespace
