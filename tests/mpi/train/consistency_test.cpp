// The cross-rank parameter check (train/consistency.hpp) at 1, 2 and 4 ranks over a store
// of three small tensors: equal replicas pass; a rank whose copy differs makes every rank
// throw the same CollectiveError (exit 6) naming the step, the first tensor that differs,
// the reference rank and the differing ranks, for each place replicas live: the data
// group, the tensor slices (a norm every slice holds whole), the two ends of the pipeline
// (the embedding table's copy) and the expert-data group (own routed experts).
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/exit_codes.hpp"
#include "model/layers/embedding.hpp"
#include "mpi_world.hpp"
#include "train/consistency.hpp"

namespace dst::train {
namespace {

using dst::test::world_rank;
using dst::test::world_size;

std::vector<model::ParamSpec> specs(bool experts = false) {
  std::vector<model::ParamSpec> s(3);
  s[0].name = model::kEmbeddingTableName;
  s[0].shape = tensor::Shape{4, 3};
  s[1].name = "model.norm.weight";
  s[1].shape = tensor::Shape{3};
  s[2].name = experts ? "model.layers.0.mlp.experts.0.down_proj.weight" : "lm_head.weight";
  s[2].shape = tensor::Shape{2, 3};
  if (experts) s[2].ep_size = 2;
  return s;
}

/// A store of specs(), every element 0.5 (then `poke`: +1 at tensor `poke`'s element 1).
std::unique_ptr<model::ParamStore> store(int poke = -1, bool experts = false) {
  auto ps = std::make_unique<model::ParamStore>(specs(experts), tensor::Arena::Mode::allocate);
  std::fill(ps->params_data(), ps->params_data() + ps->buffer_elements(), 0.5f);
  if (poke >= 0) ps->param(static_cast<std::size_t>(poke)).ptr<float>()[1] += 1.0f;
  return ps;
}

/// Runs the check; "" when it passes, else the message, which must be a CollectiveError
/// with exit 6 (and the same on every rank: compared through rank 0's).
std::string outcome(comm::ProcessGroups& groups, const config::Layout& layout,
                    ConsistencyChecker::Replicas replicas, const model::ParamStore& ps) {
  std::string what;
  try {
    ConsistencyChecker(groups, layout, replicas).check(ps, {}, 7);
  } catch (const CollectiveError& e) {
    EXPECT_EQ(e.exit_code(), kExitDiverged);
    what = e.what();
  }
  EXPECT_EQ(dst::test::rank0_text(what), what) << "rank " << world_rank();  // every rank alike
  return what;
}

TEST(ConsistencyChecker, EqualReplicasPass) {
  const config::Layout layout = dst::test::world_layout(world_size(), 1, 1);
  comm::ProcessGroups groups = comm::make_process_groups(MPI_COMM_WORLD, layout, 30.0);
  EXPECT_EQ(outcome(groups, layout, {}, *store()), "");
}

TEST(ConsistencyChecker, NamesTheFirstDataReplicaThatDiffers) {
  if (world_size() < 2) GTEST_SKIP() << "one rank has no replica";
  const config::Layout layout = dst::test::world_layout(world_size(), 1, 1);
  comm::ProcessGroups groups = comm::make_process_groups(MPI_COMM_WORLD, layout, 30.0);
  // The last rank differs in tensor 1 and 2, rank 1 in tensor 2: tensor 1 is the first.
  const int last = world_size() - 1;
  auto ps = store(world_rank() == last ? 1 : world_rank() == 1 ? 2 : -1);
  if (world_rank() == last) ps->param(2).ptr<float>()[0] = 9.0f;
  EXPECT_EQ(outcome(groups, layout, {}, *ps),
            "parameters differ between ranks at step 7: first tensor model.norm.weight differs "
            "from rank 0's on rank " +
                std::to_string(last));
}

TEST(ConsistencyChecker, NamesATensorSliceWhoseWholeNormDiffers) {
  if (world_size() < 2) GTEST_SKIP() << "no tensor group";
  // Tensor slices of 2 (x the rest data ranks): the norm is held whole by every slice.
  const config::Layout layout = dst::test::world_layout(world_size() / 2, 2, 1);
  comm::ProcessGroups groups = comm::make_process_groups(MPI_COMM_WORLD, layout, 30.0);
  const model::ParamStore whole(specs(), tensor::Arena::Mode::plan);
  ConsistencyChecker::Replicas r;
  r.whole = &whole;
  EXPECT_EQ(outcome(groups, layout, r, *store()), "");
  // World rank 1 is tensor rank 1 of the first tensor group.
  EXPECT_EQ(outcome(groups, layout, r, *store(world_rank() == 1 ? 1 : -1)),
            "parameters differ between the tensor slices at step 7: tensor model.norm.weight "
            "(held whole by every slice) differs from rank 0's on rank 1");
}

TEST(ConsistencyChecker, NamesTheEndOfThePipelineWhoseEmbeddingCopyDiffers) {
  if (world_size() < 2) GTEST_SKIP() << "one stage holds no copy";
  const int stages = world_size();
  const config::Layout layout = dst::test::world_layout(1, 1, stages);
  comm::ProcessGroups groups = comm::make_process_groups(MPI_COMM_WORLD, layout, 30.0);
  const model::ParamStore whole(specs(), tensor::Arena::Mode::plan);
  ConsistencyChecker::Replicas r;
  r.stage = groups.pipeline_rank;
  r.whole = &whole;
  r.shared_embedding = true;
  r.tied = true;
  EXPECT_EQ(outcome(groups, layout, r, *store()), "");
  EXPECT_EQ(outcome(groups, layout, r, *store(r.stage == stages - 1 ? 0 : -1)),
            "parameters differ between ranks at step 7: the copy of model.embed_tokens.weight on "
            "rank " +
                std::to_string(stages - 1) + " (pipeline stage " + std::to_string(stages - 1) +
                ", read by the tied head) differs from the table on rank 0 (stage 0)");
}

TEST(ConsistencyChecker, NamesTheOwnExpertReplicaThatDiffers) {
  if (world_size() != 4) GTEST_SKIP() << "2 expert slots x 2 replicas";
  // Data ranks 0-3 in expert groups {0, 1} and {2, 3}; slot 0's replicas are ranks 0 and 2,
  // slot 1's ranks 1 and 3. Each holds "its" expert 0 as the store's last tensor (the test
  // does not care which expert id it is: the fingerprints of one slot are compared).
  const config::Layout layout = dst::test::world_layout(4, 1, 1, 2);
  comm::ProcessGroups groups = comm::make_process_groups(MPI_COMM_WORLD, layout, 30.0);
  const model::ParamStore whole(specs(true), tensor::Arena::Mode::plan);
  ConsistencyChecker::Replicas r;
  r.whole = &whole;
  r.own_experts = true;
  r.own_experts_from = 2;
  r.any_stage_own_experts = true;
  // Slot 1's expert differs between ranks 1 and 3 (each slot holds its own values: the data
  // group's check leaves the own experts out).
  auto ps = store(world_rank() == 3 ? 2 : -1, true);
  if (groups.expert_rank == 1) ps->param(2).ptr<float>()[0] = 2.0f;
  EXPECT_EQ(outcome(groups, layout, r, *ps),
            "parameters differ between ranks at step 7: first tensor "
            "model.layers.0.mlp.experts.0.down_proj.weight differs from rank 1's on rank 3");
}

TEST(ConsistencyChecker, RefusesSplitStoresWithoutTheWholeLayout) {
  const config::Layout layout = dst::test::world_layout(world_size(), 1, 1);
  comm::ProcessGroups groups = comm::make_process_groups(MPI_COMM_WORLD, layout, 30.0);
  ConsistencyChecker::Replicas r;
  r.own_experts = true;
  EXPECT_THROW(ConsistencyChecker(groups, layout, r), Error);
}

}  // namespace
}  // namespace dst::train
