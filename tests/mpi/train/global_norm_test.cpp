// The whole model's squared gradient norm from one rank's share (train/global_norm.hpp) at
// 1, 2 and 4 ranks over small stores: one rank's total as it is; tensor slices (a tensor
// every slice holds whole counted once, split tensors summed); own experts (the replicated
// tensors once, each expert from its holder); pipeline stages added in the whole model's
// order, the same double as one stage, with values whose sum depends on the order.
#include <gtest/gtest.h>
#include <mpi.h>

#include <vector>

#include "comm/process_groups.hpp"
#include "core/error.hpp"
#include "mpi_world.hpp"
#include "train/global_norm.hpp"

namespace dst::train {
namespace {

using dst::test::world_rank;
using dst::test::world_size;

model::ParamStore store(const std::vector<model::Split>& splits) {
  std::vector<model::ParamSpec> specs(splits.size());
  for (std::size_t i = 0; i < specs.size(); ++i) {
    specs[i].name = "t" + std::to_string(i);
    specs[i].shape = tensor::Shape{2};
    specs[i].split = splits[i];
  }
  return model::ParamStore(specs, tensor::Arena::Mode::plan);
}

TEST(GlobalNorm, OneRanksWholeModelIsItsOwnTotal) {
  const model::ParamStore ps = store({model::Split::replicated, model::Split::column});
  // The total as given (GradNorm's own order), not re-added from the per-tensor sums.
  EXPECT_EQ(GlobalNorm({}).sum_of_squares(ps, {1.0, 2.0}, 7.5), 7.5);
  EXPECT_THROW(GlobalNorm({}).sum_of_squares(ps, {1.0}, 1.0), Error);
}

TEST(GlobalNorm, TensorSlicesCountAWholeTensorOnce) {
  if (world_size() < 2) GTEST_SKIP() << "no tensor group";
  const config::Layout layout = dst::test::world_layout(world_size() / 2, 2, 1);
  comm::ProcessGroups groups = comm::make_process_groups(MPI_COMM_WORLD, layout, 30.0);
  const model::ParamStore ps = store({model::Split::replicated, model::Split::column});
  GlobalNorm::Parts parts;
  parts.tensor = groups.tensor.get();
  parts.tensor_rank = groups.tensor_rank;
  // The norm's copies are equal (3); the column slices hold 4 and 5.
  const double slice = groups.tensor_rank == 0 ? 4.0 : 5.0;
  EXPECT_EQ(GlobalNorm(parts).sum_of_squares(ps, {3.0, slice}, -1.0), 3.0 + 4.0 + 5.0);
}

TEST(GlobalNorm, OwnExpertsComeFromTheirHolders) {
  if (world_size() < 2) GTEST_SKIP() << "no expert group";
  const config::Layout layout = dst::test::world_layout(world_size(), 1, 1, 2);
  comm::ProcessGroups groups = comm::make_process_groups(MPI_COMM_WORLD, layout, 30.0);
  const model::ParamStore ps = store({model::Split::replicated, model::Split::replicated});
  GlobalNorm::Parts parts;
  parts.expert = groups.expert.get();
  parts.own_experts_from = 1;
  // Tensor 0 replicated (2 on every rank), tensor 1 this slot's expert: 10 and 20.
  const double own = groups.expert_rank == 0 ? 10.0 : 20.0;
  EXPECT_EQ(GlobalNorm(parts).sum_of_squares(ps, {2.0, own}, -1.0), 2.0 + 30.0);
  parts.expert = nullptr;
  EXPECT_THROW(GlobalNorm{parts}, Error);
}

TEST(GlobalNorm, StagesAddInTheWholeModelsOrder) {
  if (world_size() < 2) GTEST_SKIP() << "one stage";
  const int P = world_size() >= 4 ? 4 : 2;
  if (world_size() % P != 0) GTEST_SKIP();
  const config::Layout layout = dst::test::world_layout(world_size() / P, 1, P);
  comm::ProcessGroups groups = comm::make_process_groups(MPI_COMM_WORLD, layout, 30.0);
  // The whole model: tensors 0, 1, 2 with 1e16, 1, -1e16 (in this order the 1 is lost:
  // 0; stage by stage below, 1e16 - 1e16 + 1 = 1). Stage 0 holds tensors 0 and 2, stage 1
  // tensor 1 and a copy of tensor 0 (counted from stage 0), further stages nothing.
  const int stage = groups.pipeline_rank;
  const std::vector<double> values = {1e16, 1.0, -1e16};
  std::vector<std::vector<std::size_t>> holds(static_cast<std::size_t>(P));
  holds[0] = {0, 2};
  holds[1] = {1, GlobalNorm::kNone};
  GlobalNorm::Parts parts;
  parts.pipeline = groups.pipeline.get();
  for (const auto& h : holds) {
    parts.stage_sizes.push_back(h.size());
    parts.model_index.insert(parts.model_index.end(), h.begin(), h.end());
  }
  const auto& mine = holds[static_cast<std::size_t>(stage)];
  std::vector<double> per_tensor;
  for (const std::size_t i : mine)
    per_tensor.push_back(i == GlobalNorm::kNone ? 1e16 : values[i]);
  const model::ParamStore ps =
      store(std::vector<model::Split>(mine.size(), model::Split::replicated));
  EXPECT_EQ(GlobalNorm(parts).sum_of_squares(ps, per_tensor, -1.0), (1e16 + 1.0) - 1e16);
  parts.model_index.pop_back();
  EXPECT_THROW(GlobalNorm{parts}, Error);
}

}  // namespace
}  // namespace dst::train
