// The MoE balancer (train/moe_balancer.hpp) at 1, 2 and 4 ranks on tiny-moe (MoE blocks at
// layers 1-3, 8 routed experts, top-2): the loads, dropped rows and balance loss summed over
// the data group, the metrics of each block (busiest expert over the mean, idle experts,
// the bias range); with pipeline stages (1F1B and interleaved chunks, whose blocks are not
// in the model's order) the balance loss summed over every stage and micro-batch and the
// metrics of every block in the model's order.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <vector>

#include "config/deck.hpp"
#include "mpi_world.hpp"
#include "train/moe_balancer.hpp"

namespace dst::train {
namespace {

using dst::test::world_rank;
using dst::test::world_size;

constexpr std::int64_t kExperts = 8, kSeq = 32, kGlobal = 8;

config::RunConfig deck(const std::string& parallel) {
  return config::load_deck_text(
      "model: {preset: tiny-moe}\n"
      "data: {seq_len: 32}\n"
      "training: {global_batch_size: 8, micro_batch_size: 2}\n"
      "parallel: {" +
          parallel + "}\n",
      "moe_balancer_test");
}

/// Model MoE block k's load of expert e on data rank d (d + 1 times): expert k + 1 the
/// busiest (10 (k + 1)), expert 7 idle, the others 1.
double load(std::size_t k, std::int64_t e, int d) {
  if (e == kExperts - 1) return 0.0;
  const double busiest = 10.0 * static_cast<double>(k + 1);
  return (e == static_cast<std::int64_t>(k) + 1 ? busiest : 1.0) * static_cast<double>(d + 1);
}

/// Checks block k's metrics against load() summed over `data` ranks and bias 0.01 k + ...
void expect_block(const MoeBalance& m, std::size_t k, int data) {
  const double d = static_cast<double>(data) * (data + 1) / 2.0;  // sum of d + 1
  const double busiest = 10.0 * static_cast<double>(k + 1) * d, total = busiest + 6.0 * d;
  EXPECT_DOUBLE_EQ(m.max_over_mean, busiest / (total / kExperts)) << "block " << k;
  EXPECT_DOUBLE_EQ(m.busiest_fraction, busiest / (kGlobal * kSeq)) << "block " << k;
  EXPECT_EQ(m.idle_experts, 1) << "block " << k;
  EXPECT_FLOAT_EQ(static_cast<float>(m.bias_min), 0.5f * static_cast<float>(k)) << "block " << k;
  EXPECT_FLOAT_EQ(static_cast<float>(m.bias_max), 0.5f * static_cast<float>(k) + 0.07f)
      << "block " << k;
}

/// This rank's loads and biases of the model's MoE blocks `blocks` (their indices), in order.
void fill(const std::vector<std::size_t>& blocks, int data_rank, std::vector<double>& loads,
          std::vector<float>& bias) {
  for (const std::size_t k : blocks)
    for (std::int64_t e = 0; e < kExperts; ++e) {
      loads.push_back(load(k, e, data_rank));
      bias.push_back(0.5f * static_cast<float>(k) + 0.01f * static_cast<float>(e));
    }
}

TEST(MoeBalancer, SumsTheLoadsOverTheDataGroup) {
  const config::RunConfig cfg = deck("data: auto");
  const config::Layout layout = config::resolve_layout(cfg, world_size());
  comm::ProcessGroups groups = comm::make_process_groups(MPI_COMM_WORLD, layout, 30.0);
  MoeBalancer balancer(cfg, layout, groups);
  ASSERT_TRUE(balancer.active());
  ASSERT_EQ(balancer.own_blocks(), 3u);
  std::vector<double> loads;
  std::vector<float> bias;
  fill({0, 1, 2}, groups.data_rank, loads, bias);
  const int n = world_size();
  const MoeBalancer::Sums sums =
      balancer.reduce(loads, groups.data_rank, 0.5 * (groups.data_rank + 1));
  EXPECT_EQ(sums.dropped, n * (n - 1) / 2.0);
  EXPECT_EQ(sums.aux, 0.5 * n * (n + 1) / 2.0);
  ASSERT_EQ(sums.loads.size(), 3u * kExperts);
  StepStats st;
  balancer.report(sums, bias, st, 0);
  EXPECT_EQ(st.aux_loss, sums.aux / kGlobal);
  EXPECT_EQ(st.moe_dropped, sums.dropped);
  EXPECT_FALSE(st.moe_capacity);
  EXPECT_DOUBLE_EQ(st.moe_dropped_fraction, sums.dropped / (kGlobal * kSeq * 2.0 * 3.0));
  ASSERT_EQ(st.moe.size(), 3u);
  for (std::size_t k = 0; k < 3; ++k)
    expect_block(st.moe[k], k, n);
}

/// Stages of `parallel` (2 stages): each rank keeps its blocks' balance-loss terms; the
/// whole model's sum and every block's metrics in the model's order.
void run_stages(const std::string& parallel, const std::vector<std::vector<std::size_t>>& chunks) {
  if (world_size() < 2) GTEST_SKIP() << "one rank holds one stage";
  const config::RunConfig cfg = deck(parallel);
  const config::Layout layout = config::resolve_layout(cfg, world_size());
  comm::ProcessGroups groups = comm::make_process_groups(MPI_COMM_WORLD, layout, 30.0);
  MoeBalancer balancer(cfg, layout, groups);
  const int stage = groups.pipeline_rank;
  const auto& mine = chunks[static_cast<std::size_t>(stage)];  // chunk-major: its blocks
  std::vector<std::size_t> own;
  const std::int64_t m = layout.grad_accum_steps;
  balancer.begin_step(m);
  // Term of model block k in micro-batch mb on data rank d: (k + 1) (mb + 1) (d + 1).
  const auto term = [&](std::size_t k, std::int64_t mb) {
    return static_cast<double>((k + 1) * static_cast<std::size_t>(mb + 1) *
                               static_cast<std::size_t>(groups.data_rank + 1));
  };
  for (std::size_t c = 0; c < mine.size(); ++c)
    for (std::int64_t mb = 0; mb < m; ++mb) {
      std::vector<double> terms;
      if (mine[c] != static_cast<std::size_t>(-1)) terms.push_back(term(mine[c], mb));
      balancer.keep_terms(mb, static_cast<int>(c), terms);
    }
  for (const std::size_t k : mine)
    if (k != static_cast<std::size_t>(-1)) own.push_back(k);
  ASSERT_EQ(balancer.own_blocks(), own.size());
  std::vector<double> loads;
  std::vector<float> bias;
  fill(own, groups.data_rank, loads, bias);
  const MoeBalancer::Sums sums = balancer.reduce(loads, 1.0, -1.0);  // aux_sum ignored
  // sum over k, mb, d of (k + 1)(mb + 1)(d + 1): 6 x m(m + 1)/2 x D(D + 1)/2.
  const double D = layout.data;
  EXPECT_EQ(sums.aux, 6.0 * m * (m + 1) / 2.0 * D * (D + 1) / 2.0);
  StepStats st;
  balancer.report(sums, bias, st, 0);
  EXPECT_EQ(st.moe_dropped, 2.0 * D) << "each stage's rows, summed over data and stages";
  ASSERT_EQ(st.moe.size(), 3u);
  for (std::size_t k = 0; k < 3; ++k)
    expect_block(st.moe[k], k, layout.data);
}

constexpr std::size_t kDense = static_cast<std::size_t>(-1);  // a chunk without MoE block

TEST(MoeBalancer, OneFOneBStagesCoverTheWholeModel) {
  // Stage 0: blocks 0 (dense) and 1 (MoE block 0); stage 1: blocks 2, 3 (MoE blocks 1, 2).
  // One chunk each: the chunk's terms come as one vector per micro-batch.
  if (world_size() < 2) GTEST_SKIP() << "one rank holds one stage";
  const config::RunConfig cfg = deck("pipeline: 2");
  const config::Layout layout = config::resolve_layout(cfg, world_size());
  comm::ProcessGroups groups = comm::make_process_groups(MPI_COMM_WORLD, layout, 30.0);
  MoeBalancer balancer(cfg, layout, groups);
  const std::vector<std::size_t> own =
      groups.pipeline_rank == 0 ? std::vector<std::size_t>{0} : std::vector<std::size_t>{1, 2};
  ASSERT_EQ(balancer.own_blocks(), own.size());
  const std::int64_t m = layout.grad_accum_steps;
  balancer.begin_step(m);
  for (std::int64_t mb = 0; mb < m; ++mb) {
    std::vector<double> terms;
    for (const std::size_t k : own)
      terms.push_back(static_cast<double>((k + 1) * static_cast<std::size_t>(mb + 1)));
    balancer.keep_terms(mb, 0, terms);
  }
  std::vector<double> loads;
  std::vector<float> bias;
  fill(own, groups.data_rank, loads, bias);
  const MoeBalancer::Sums sums = balancer.reduce(loads, 0.0, -1.0);
  const double D = layout.data;
  EXPECT_EQ(sums.aux, 6.0 * m * (m + 1) / 2.0 * D);
  StepStats st;
  balancer.report(sums, bias, st, 0);
  ASSERT_EQ(st.moe.size(), 3u);
  for (std::size_t k = 0; k < 3; ++k)
    expect_block(st.moe[k], k, layout.data);
}

TEST(MoeBalancer, InterleavedChunksComeBackInTheModelsOrder) {
  // Virtual stages 2 x 2 stages: rank 0 holds blocks 0 (dense) and 2 (MoE block 1), rank 1
  // blocks 1 (MoE block 0) and 3 (MoE block 2): stage order 1, 0, 2.
  run_stages("pipeline: 2, pipeline_schedule: interleaved, virtual_stages: 2",
             {{kDense, 1}, {0, 2}});
}

}  // namespace
}  // namespace dst::train
