// Naming non-finite gradients (train/nonfinite.hpp) at 1, 2 and 4 ranks over a store of
// three small tensors: the lowest rank whose own gradient had one and its element, with
// the rank's stage and slice in split layouts and the element's index in the whole tensor
// for a slice; when no own gradient had one, the lowest tensor whose summed gradient does,
// over the ranges each rank holds (ZeRO's shards); the same text on every rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <limits>
#include <string>
#include <vector>

#include "comm/process_groups.hpp"
#include "mpi_world.hpp"
#include "train/nonfinite.hpp"

namespace dst::train {
namespace {

using dst::test::world_rank;
using dst::test::world_size;

/// Three tensors; with `slices`, the last one a column slice (rows tp_rank of 2) of a
/// (4, 3) whole tensor.
std::vector<model::ParamSpec> specs(int slice = -1) {
  std::vector<model::ParamSpec> s(3);
  s[0].name = "model.embed_tokens.weight";
  s[0].shape = tensor::Shape{4, 3};
  s[1].name = "model.norm.weight";
  s[1].shape = tensor::Shape{3};
  s[2].name = "lm_head.weight";
  s[2].shape = tensor::Shape{slice >= 0 ? 2 : 4, 3};
  if (slice >= 0) {
    s[2].split = model::Split::column;
    s[2].tp_rank = slice;
    s[2].tp_size = 2;
  }
  return s;
}

/// The name on this rank, checked equal to rank 0's.
std::string named(const NonFiniteNamer& namer, const model::ParamStore& ps, std::int64_t offset,
                  std::vector<std::pair<std::size_t, std::size_t>> summed = {}) {
  if (summed.empty()) summed.emplace_back(0, ps.buffer_elements());
  const std::string what = namer.name(ps, {}, offset, summed);
  EXPECT_EQ(dst::test::rank0_text(what), what) << "rank " << world_rank();
  return what;
}

TEST(NonFiniteNamer, NamesTheLowestRankWhoseOwnGradientHadOne) {
  const config::Layout layout = dst::test::world_layout(world_size(), 1, 1);
  comm::ProcessGroups groups = comm::make_process_groups(MPI_COMM_WORLD, layout, 30.0);
  model::ParamStore ps(specs(), tensor::Arena::Mode::allocate);
  ps.zero_grads();
  // Every rank from 1 on in tensor 1's element 2 (one rank: in tensor 2's element 5).
  std::int64_t offset = world_size() == 1 ? static_cast<std::int64_t>(ps.spec(2).offset) + 5 : -1;
  if (world_rank() >= 1) offset = static_cast<std::int64_t>(ps.spec(1).offset) + 2;
  const NonFiniteNamer namer(*groups.world, layout, ps);
  EXPECT_EQ(named(namer, ps, offset), world_size() == 1
                                          ? "first on rank 0, tensor lm_head.weight[5]"
                                          : "first on rank 1, tensor model.norm.weight[2]");
}

TEST(NonFiniteNamer, NamesTheStageAndTheSliceAndTheWholeTensorsElement) {
  if (world_size() != 4) GTEST_SKIP() << "2 stages x 2 tensor slices";
  const config::Layout layout = dst::test::world_layout(1, 2, 2);
  comm::ProcessGroups groups = comm::make_process_groups(MPI_COMM_WORLD, layout, 30.0);
  const model::ParamStore whole(specs(), tensor::Arena::Mode::plan);
  model::ParamStore ps(specs(groups.tensor_rank), tensor::Arena::Mode::allocate);
  ps.zero_grads();
  // World rank 3 (stage 1, slice 1) alone: its slice's element 4 (row 1, column 1) is
  // the whole tensor's row 3, column 1: element 10.
  const std::int64_t offset =
      world_rank() == 3 ? static_cast<std::int64_t>(ps.spec(2).offset) + 4 : -1;
  const NonFiniteNamer namer(*groups.world, layout, whole);
  EXPECT_EQ(named(namer, ps, offset),
            "first on rank 3 (pipeline stage 1, tensor slice 1), tensor lm_head.weight[10]");
}

TEST(NonFiniteNamer, NamesTheLowestOverflowedSumOverTheShards) {
  const config::Layout layout = dst::test::world_layout(world_size(), 1, 1);
  comm::ProcessGroups groups = comm::make_process_groups(MPI_COMM_WORLD, layout, 30.0);
  model::ParamStore ps(specs(), tensor::Arena::Mode::allocate);
  ps.zero_grads();
  const NonFiniteNamer namer(*groups.world, layout, ps);
  EXPECT_EQ(named(namer, ps, -1),
            "no rank's own gradient was non-finite (the sum overflowed); first tensor ?");
  // Infinities in tensors 1 and 2 on every rank; the last rank holds the sums of tensor 2
  // only, the others those of tensors 0 and 1 (one rank: every tensor).
  ps.grad(1).ptr<float>()[1] = std::numeric_limits<float>::infinity();
  ps.grad(2).ptr<float>()[0] = std::numeric_limits<float>::infinity();
  const bool last = world_rank() == world_size() - 1 && world_size() > 1;
  const std::vector<std::pair<std::size_t, std::size_t>> shard = {
      last ? std::make_pair(ps.spec(2).offset, ps.buffer_elements())
           : std::make_pair(std::size_t{0},
                            world_size() > 1 ? ps.spec(2).offset : ps.buffer_elements())};
  EXPECT_EQ(named(namer, ps, -1, shard),
            "no rank's own gradient was non-finite (the sum overflowed); first tensor "
            "model.norm.weight");
  // Only the last rank's shard overflowed: its tensor, although the others hold lower ones.
  ps.grad(1).ptr<float>()[1] = 0.0f;
  EXPECT_EQ(named(namer, ps, -1, shard),
            "no rank's own gradient was non-finite (the sum overflowed); first tensor "
            "lm_head.weight");
}

}  // namespace
}  // namespace dst::train
