// Process groups for every layout that fits the running world size, checked against
// membership computed here by enumerating the (pipeline, data, tensor) grid in the
// documented rank order, independently of comm::rank_coords.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "comm/mpi_communicator.hpp"
#include "comm/process_groups.hpp"
#include "core/error.hpp"
#include "mpi_world.hpp"

namespace {

using dst::test::world_rank;
using dst::test::world_size;

using dst::DType;
using dst::comm::Communicator;
using dst::config::Layout;

using dst::test::kTestTimeoutS;

Layout make_layout(int data, int tensor, int pipeline) {
  Layout l;
  l.data = data;
  l.tensor = tensor;
  l.pipeline = pipeline;
  l.world_size = data * tensor * pipeline;
  return l;
}

/// Every factorisation data*tensor*pipeline of the world size (1, 2, 4 ranks: data-only,
/// tensor=2, pipeline=2, tensor=2 x pipeline=2, ...).
std::vector<Layout> layouts_for(int n) {
  std::vector<Layout> out;
  for (int d = 1; d <= n; ++d)
    for (int t = 1; t <= n; ++t)
      for (int p = 1; p <= n; ++p)
        if (d * t * p == n) out.push_back(make_layout(d, t, p));
  return out;
}

struct Grid {
  // coords[w] = {pipeline, data, tensor} of world rank w: tensor fastest, then data.
  std::vector<std::vector<int>> coords;
};

Grid enumerate(const Layout& l) {
  Grid g;
  for (int p = 0; p < l.pipeline; ++p)
    for (int d = 0; d < l.data; ++d)
      for (int t = 0; t < l.tensor; ++t)
        g.coords.push_back({p, d, t});
  return g;
}

/// World ranks sharing every coordinate with `me` except `free_axis`, by that axis.
std::vector<std::int32_t> members(const Grid& g, int me, int free_axis) {
  std::vector<std::int32_t> out;
  for (int value = 0;; ++value) {
    bool found = false;
    for (std::size_t w = 0; w < g.coords.size(); ++w) {
      bool same = true;
      for (int axis = 0; axis < 3; ++axis)
        if (axis != free_axis && g.coords[w][axis] != g.coords[me][axis]) same = false;
      if (same && g.coords[w][free_axis] == value) {
        out.push_back(static_cast<std::int32_t>(w));
        found = true;
      }
    }
    if (!found) return out;
  }
}

std::vector<std::int32_t> gather_world_ranks(Communicator& group) {
  std::vector<std::int32_t> got(static_cast<std::size_t>(group.size()), -1);
  const std::int32_t mine = world_rank();
  group.allgather(&mine, got.data(), 1, DType::i32);
  return got;
}

std::string text(const Layout& l) {
  return "data=" + std::to_string(l.data) + " tensor=" + std::to_string(l.tensor) +
         " pipeline=" + std::to_string(l.pipeline);
}

TEST(ProcessGroups, EveryLayoutOfThisWorldSplitsAsDocumented) {
  const int n = world_size();
  const int me = world_rank();
  const auto layouts = layouts_for(n);
  ASSERT_FALSE(layouts.empty());
  for (const Layout& l : layouts) {
    SCOPED_TRACE(text(l));
    const Grid grid = enumerate(l);
    auto g = dst::comm::make_process_groups(MPI_COMM_WORLD, l, kTestTimeoutS);
    const auto& c = grid.coords[me];  // {pipeline, data, tensor}
    EXPECT_EQ(g.pipeline_rank, c[0]);
    EXPECT_EQ(g.data_rank, c[1]);
    EXPECT_EQ(g.tensor_rank, c[2]);
    EXPECT_EQ(g.world->size(), n);
    EXPECT_EQ(g.world->rank(), me);
    EXPECT_EQ(g.data->size(), l.data);
    EXPECT_EQ(g.tensor->size(), l.tensor);
    EXPECT_EQ(g.pipeline->size(), l.pipeline);
    EXPECT_EQ(g.data->rank(), g.data_rank);
    EXPECT_EQ(g.tensor->rank(), g.tensor_rank);
    EXPECT_EQ(g.pipeline->rank(), g.pipeline_rank);
    EXPECT_EQ(g.data->name(), "data");
    EXPECT_EQ(g.tensor->name(), "tensor");
    EXPECT_EQ(g.pipeline->name(), "pipeline");
    EXPECT_EQ(g.data->timeout_s(), kTestTimeoutS);

    // Membership and order come from the real split communicators, not from the struct.
    EXPECT_EQ(gather_world_ranks(*g.pipeline), members(grid, me, 0));
    EXPECT_EQ(gather_world_ranks(*g.data), members(grid, me, 1));
    EXPECT_EQ(gather_world_ranks(*g.tensor), members(grid, me, 2));

    // A sum over the data group only adds data-parallel peers.
    const auto dsum = g.data->allreduce_value<std::int64_t>(me, dst::comm::ReduceOp::sum);
    std::int64_t expect = 0;
    for (auto w : members(grid, me, 1))
      expect += w;
    EXPECT_EQ(dsum, expect);

    EXPECT_NO_THROW(dst::comm::verify_process_groups(g));

    // rank_coords/world_rank_of agree with the enumeration.
    for (int w = 0; w < n; ++w) {
      const auto rc = dst::comm::rank_coords(w, l);
      EXPECT_EQ(rc.pipeline, grid.coords[w][0]);
      EXPECT_EQ(rc.data, grid.coords[w][1]);
      EXPECT_EQ(rc.tensor, grid.coords[w][2]);
      EXPECT_EQ(dst::comm::world_rank_of(rc, l), w);
    }
  }
}

// Expert groups (parallel.expert = X): X consecutive data ranks of one data group, and
// across them the data ranks at the same position (holding the same experts).
TEST(ProcessGroups, ExpertGroupsAreConsecutiveDataRanks) {
  const int n = world_size();
  const int me = world_rank();
  for (int tensor = 1; tensor <= n; tensor *= 2) {
    const int data = n / tensor;
    for (int X = 1; X <= data; X *= 2) {
      Layout l = make_layout(data, tensor, 1);
      l.expert = X;
      SCOPED_TRACE(text(l) + " expert=" + std::to_string(X));
      const Grid grid = enumerate(l);
      auto g = dst::comm::make_process_groups(MPI_COMM_WORLD, l, kTestTimeoutS);
      EXPECT_EQ(g.expert->size(), X);
      EXPECT_EQ(g.expert_data->size(), data / X);
      EXPECT_EQ(g.expert_rank, g.data_rank % X);
      EXPECT_EQ(g.expert->rank(), g.data_rank % X);
      EXPECT_EQ(g.expert_data->rank(), g.data_rank / X);
      EXPECT_EQ(g.expert->name(), "expert");
      EXPECT_EQ(g.expert_data->name(), "expert_data");
      // Members: the data group's world ranks, in data-rank order.
      const std::vector<std::int32_t> dm = members(grid, me, 1);
      std::vector<std::int32_t> want_expert, want_expert_data;
      for (int d = 0; d < data; ++d) {
        if (d / X == g.data_rank / X) want_expert.push_back(dm[static_cast<std::size_t>(d)]);
        if (d % X == g.data_rank % X) want_expert_data.push_back(dm[static_cast<std::size_t>(d)]);
      }
      EXPECT_EQ(gather_world_ranks(*g.expert), want_expert);
      EXPECT_EQ(gather_world_ranks(*g.expert_data), want_expert_data);
      EXPECT_NO_THROW(dst::comm::verify_process_groups(g));
    }
  }
  Layout bad = make_layout(n, 1, 1);
  bad.expert = 3;
  if (n % 3 != 0)
    EXPECT_THROW(dst::comm::make_process_groups(MPI_COMM_WORLD, bad, kTestTimeoutS), dst::Error);
}

TEST(ProcessGroups, LayoutThatDoesNotFitTheWorldIsRejected) {
  const int n = world_size();
  try {
    dst::comm::make_process_groups(MPI_COMM_WORLD, make_layout(n + 1, 1, 1), kTestTimeoutS);
    FAIL() << "no error for a layout of " << n + 1 << " ranks";
  } catch (const dst::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(
        m.find("needs " + std::to_string(n + 1) + " ranks but the job has " + std::to_string(n)),
        std::string::npos)
        << m;
  }
  Layout stale = make_layout(n, 1, 1);
  stale.world_size = n + 3;
  EXPECT_THROW(dst::comm::make_process_groups(MPI_COMM_WORLD, stale, kTestTimeoutS), dst::Error);
  EXPECT_THROW(dst::comm::make_process_groups(MPI_COMM_WORLD, make_layout(0, 1, 1), 1.0),
               dst::Error);
}

TEST(ProcessGroups, VerifyNamesAGroupWhoseMembersDiffer) {
  const int n = world_size();
  if (n < 2) GTEST_SKIP() << "at 1 rank every layout has the same groups";
  auto g = dst::comm::make_process_groups(MPI_COMM_WORLD, make_layout(n, 1, 1), kTestTimeoutS);
  // Pretend the groups were made for tensor parallelism: the data group then has other
  // members than expected, which the start-up check must notice (on every rank alike).
  g.data_size = 1;
  g.tensor_size = n;
  try {
    dst::comm::verify_process_groups(g);
    FAIL() << "mismatched groups passed the start-up check";
  } catch (const dst::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("group 'data'"), std::string::npos) << m;
    EXPECT_NE(m.find("members are world ranks"), std::string::npos) << m;
  }
}

}  // namespace
