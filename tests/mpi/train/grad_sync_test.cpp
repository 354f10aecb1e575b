// The gradient synchronisation strategies (train/grad_sync.hpp) at 1, 2 and 4 ranks on the
// tiny model: replicated buckets over MPI, the shared-memory update (whole, ZeRO-1, and
// ZeRO-2 with the bf16 master shard), ZeRO 1 and 2 over MPI (fp32, and bf16 with the
// master shard), and own experts (tiny-moe,
// one expert slot per rank) as a second region. Every rank writes gradients of its own
// whose sum over the ranks is exact in f32; a one-rank reference (a model of the same
// layout, AdamW over its whole store, the summed gradients) must then give the same bits:
// the sums where the rank holds them, the gradient norm's local total, the parameters
// after two updates, and the whole optimizer state a checkpoint saves, also after a
// restore of it.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "config/deck.hpp"
#include "core/error.hpp"
#include "mpi_world.hpp"
#include "train/grad_sync.hpp"
#include "train/plan.hpp"

namespace dst::train {
namespace {

using dst::test::world_size;

constexpr std::int64_t kSeq = 8;

/// Data rank d's gradient of element i: multiples of 2^-6 in [-8, 8] 2^-6, so any sum of
/// up to 4 ranks is exact in f32 whatever the order.
float grad_of(std::size_t i, int d) {
  return static_cast<float>(static_cast<int>((i * 7 + static_cast<std::size_t>(d) * 3) % 17) - 8) /
         64.0f;
}

struct Case {
  std::string name;
  std::string deck;  ///< the model, precision and parallel sections
  runtime::CommBackend backend;
};

/// `sections` (model, parallel, training.precision: "{GB}" stands for the global batch
/// size, a micro-batch per rank) with data.seq_len kSeq.
config::RunConfig deck(std::string sections) {
  const std::string gb = std::to_string(world_size());
  for (std::size_t at; (at = sections.find("{GB}")) != std::string::npos;)
    sections.replace(at, 4, gb);
  return config::load_deck_text(sections + "data: {seq_len: 8}\n", "grad_sync_test");
}

/// One rank's strategy over a model, and the reference: a model of the same layout whose
/// AdamW updates its whole store with the gradients summed exactly.
struct Synced {
  Case which;
  config::RunConfig cfg;
  config::Layout layout;
  comm::ProcessGroups groups;
  std::unique_ptr<GradSync> sync;
  std::unique_ptr<model::LanguageModel> model, reference;
  std::unique_ptr<AdamW> reference_optimizer;
  bool own_experts = false;

  explicit Synced(const Case& c)
      : which(c),
        cfg(deck(c.deck)),
        layout(config::resolve_layout(cfg, world_size())),
        groups(comm::make_process_groups(MPI_COMM_WORLD, layout, 30.0)) {
    own_experts = layout.expert > 1;
    GradSync::Setup setup;
    setup.config = &cfg;
    setup.groups = &groups;
    setup.backend = c.backend;
    const model::ExpertSlice experts{own_experts ? groups.expert_rank : 0,
                                     own_experts ? layout.expert : 1};
    setup.elements = model::flat_buffer_elements(model::stage_parameter_layout(
        cfg.model, {model::StageBlocks::whole()}, model::TensorSlice{}, experts));
    setup.own_experts = own_experts;
    sync = GradSync::make(setup);
    model::ModelOptions options;
    options.storage = model::storage_type(cfg.training.precision);
    options.ep = experts;
    // The reference: the same layout in memory of its own, its master inside.
    reference = std::make_unique<model::LanguageModel>(cfg.model, 1, kSeq,
                                                       tensor::Arena::Mode::allocate, options);
    options.gradient_memory = sync->grad_memory();
    options.param_memory = sync->param_memory();
    options.master_outside = sync->master_shard();
    model = std::make_unique<model::LanguageModel>(cfg.model, 1, kSeq,
                                                   tensor::Arena::Mode::allocate, options);
    sync->attach(model->params());
    model->params().initialize(7);
    sync->initialize(*model);
    reference->params().initialize(7);
    reference_optimizer = std::make_unique<AdamW>(cfg.training.optimizer, reference->params());
  }

  std::size_t elements() const { return model->params().buffer_elements(); }

  /// Gradients into the strategy's buffer (this rank's) and the reference's (the sum over
  /// the ranks holding each element: the data group, or for own experts this rank alone,
  /// its expert-data group having one rank here).
  void write_gradients(int step) {
    sync->begin_step();
    float* mine = model->params().grads_data();
    for (std::size_t i = 0; i < elements(); ++i)
      mine[i] = grad_of(i + static_cast<std::size_t>(step), groups.data_rank);
    reference_gradients(step);
  }
  void reference_gradients(int step) {
    float* sum = reference->params().grads_data();
    const std::size_t experts_from = sync->own_experts().offset;
    for (std::size_t i = 0; i < elements(); ++i) {
      const std::size_t k = i + static_cast<std::size_t>(step);
      float s = 0.0f;
      for (int d = 0; d < layout.data; ++d)
        if (i < experts_from || d == groups.data_rank) s += grad_of(k, d);
      sum[i] = s;
    }
  }
};

const std::string kBatch = "micro_batch_size: 1, global_batch_size: {GB}";
// tiny and tiny-moe at a quarter width (mpi_world.hpp): with 20 KB buckets still tens of
// buckets, shards that cut tensors, every kind of tensor.
const std::string kTiny = dst::test::kQuarterTiny;
const std::string kTinyMoe = dst::test::kQuarterTinyMoe;

const Case kCases[] = {
    {"replicated_mpi",
     kTiny + "training: {" + kBatch + "}\nparallel: {zero_stage: 0, bucket_mb: 0.02}\n",
     runtime::CommBackend::mpi},
    {"shared", kTiny + "training: {" + kBatch + "}\nparallel: {zero_stage: 0, bucket_mb: 0.02}\n",
     runtime::CommBackend::shm},
    {"shared_zero1",
     kTiny + "training: {" + kBatch + "}\nparallel: {zero_stage: 1, bucket_mb: 0.02}\n",
     runtime::CommBackend::shm},
    {"zero1", kTiny + "training: {" + kBatch + "}\nparallel: {zero_stage: 1, bucket_mb: 0.02}\n",
     runtime::CommBackend::mpi},
    {"zero2", kTiny + "training: {" + kBatch + "}\nparallel: {zero_stage: 2, bucket_mb: 0.02}\n",
     runtime::CommBackend::mpi},
    {"zero1_bf16_master_shard",
     kTiny + "training: {precision: bf16, " + kBatch +
         "}\n"
         "parallel: {zero_stage: 1, bucket_mb: 0.02}\n",
     runtime::CommBackend::mpi},
    {"shared_zero2_bf16_master_shard",
     kTiny + "training: {precision: bf16, " + kBatch +
         "}\n"
         "parallel: {zero_stage: 2, bucket_mb: 0.02}\n",
     runtime::CommBackend::shm},
};

/// The same bits as the reference: the sums this rank holds, the norm's local total, the
/// parameters after two updates, the saved state, and a restore of it.
void expect_reference_bits(Synced& run) {
  const config::Precision precision = run.cfg.training.precision;
  const std::size_t n = run.elements();
  GradNorm norm, reference_norm;
  for (int step = 0; step < 2; ++step) {
    run.write_gradients(step);
    run.sync->ready(0);  // backward done: every bucket may start
    run.sync->wait_all();
    EXPECT_EQ(run.sync->first_nonfinite_offset(), -1);
    const float* g = run.model->params().grads_data();
    const float* want = run.reference->params().grads_data();
    std::size_t wrong = 0;
    for (const auto& [first, last] : run.sync->summed_ranges())
      for (std::size_t i = first; i < last; ++i)
        wrong += std::memcmp(&g[i], &want[i], sizeof(float)) != 0 ? 1 : 0;
    EXPECT_EQ(wrong, 0u) << "gradient sums differ from the exact sums, step " << step;
    std::vector<double> per_tensor;
    const double total = run.sync->norm_sums(norm, per_tensor);
    const double reference_total = reference_norm.compute({}, run.reference->params());
    EXPECT_EQ(per_tensor, reference_norm.per_tensor()) << "step " << step;
    // Own experts: GlobalNorm adds the per-tensor sums over the expert group; the total is
    // the whole model's only where the rank holds all of it.
    if (!run.own_experts) {
      EXPECT_EQ(total, reference_total) << "step " << step;
    }
    run.sync->update(*run.model, 1e-3, 0.5);
    run.reference_optimizer->step({}, run.reference->params(), 1e-3, 0.5);
  }
  EXPECT_EQ(run.sync->optimizer_steps(), 2);
  // The whole state, as a checkpoint saves it (the other ranks' parts gathered).
  const GradSync::State saved = run.sync->saved();
  const AdamWState ref = run.reference_optimizer->state();
  const float* ref_params = run.reference->params().params_data();
  EXPECT_EQ(std::memcmp(saved.m, ref.m, n * sizeof(float)), 0) << "first moments";
  EXPECT_EQ(std::memcmp(saved.v, ref.v, n * sizeof(float)), 0) << "second moments";
  EXPECT_EQ(std::memcmp(saved.params, ref_params, n * sizeof(float)), 0) << "parameters";
  if (precision == config::Precision::fp32) {
    // The model computes on the parameters the ranks gathered.
    EXPECT_EQ(std::memcmp(run.model->params().params_data(), ref_params, n * sizeof(float)), 0);
  }
  // That state restored into a fresh strategy and model (as a resumed run's), then a
  // third step: still the reference's bits.
  Synced resumed(run.which);
  const GradSync::State into = resumed.sync->to_restore();
  std::copy(saved.m, saved.m + n, into.m);
  std::copy(saved.v, saved.v + n, into.v);
  std::copy(saved.params, saved.params + n, into.params);
  resumed.sync->restored(2);
  resumed.model->refresh_compute_params();
  resumed.write_gradients(2);
  resumed.sync->ready(0);
  resumed.sync->wait_all();
  resumed.sync->update(*resumed.model, 1e-3, 0.5);
  run.reference_gradients(2);
  run.reference_optimizer->step({}, run.reference->params(), 1e-3, 0.5);
  EXPECT_EQ(resumed.sync->optimizer_steps(), 3);
  const GradSync::State after = resumed.sync->saved();
  const AdamWState ref3 = run.reference_optimizer->state();
  EXPECT_EQ(std::memcmp(after.params, ref_params, n * sizeof(float)), 0) << "after a restore";
  EXPECT_EQ(std::memcmp(after.m, ref3.m, n * sizeof(float)), 0) << "after a restore";
  EXPECT_EQ(std::memcmp(after.v, ref3.v, n * sizeof(float)), 0) << "after a restore";
}

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

class GradSyncBits : public ::testing::TestWithParam<Case> {};

TEST_P(GradSyncBits, GivesTheOneRankReferenceBits) {
  Synced run(GetParam());
  expect_reference_bits(run);
}

INSTANTIATE_TEST_SUITE_P(Strategies, GradSyncBits, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

TEST(GradSync, ShardsTheStateOverTheDataRanks) {
  // ZeRO over MPI: each rank sums and updates its shard of whole tensors only; the shards
  // tile the buffer.
  Synced run(kCases[3]);
  const auto ranges = run.sync->summed_ranges();
  ASSERT_EQ(ranges.size(), 1u);
  EXPECT_EQ(run.sync->zero_stage(), world_size() > 1 ? 1 : 0);
  std::uint64_t held = ranges[0].second - ranges[0].first;
  MPI_Allreduce(MPI_IN_PLACE, &held, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(held, run.elements());
  if (world_size() > 1) {
    EXPECT_LT(ranges[0].second - ranges[0].first, run.elements());
  }
}

TEST(GradSync, TheHeaviestRanksMomentsAreWhatThePlanSays) {
  // `dstrain check`'s plan sizes ZeRO's state with the strategies' own shards: the most
  // moment bytes any rank holds is the plan's optimizer memory, to the byte.
  for (const Case& c : {kCases[0], kCases[1], kCases[2], kCases[3], kCases[4]}) {
    SCOPED_TRACE(c.name);
    Synced run(c);
    std::uint64_t most = run.sync->moment_bytes();
    MPI_Allreduce(MPI_IN_PLACE, &most, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    PlanOptions options;
    options.zero_stage = run.sync->zero_stage();
    options.bucket_copies = c.backend != runtime::CommBackend::shm;
    EXPECT_EQ(most, make_plan(run.cfg, run.layout, options).memory.optimizer);
  }
}

TEST(GradSync, OwnExpertsAreASecondRegion) {
  // tiny-moe with one expert slot per rank: the replicated tensors summed over the data
  // group, each rank's own experts over its expert-data group (itself).
  if (world_size() == 1) GTEST_SKIP() << "own experts need an expert group of 2 or more ranks";
  for (const char* zero : {"0", "1"}) {
    SCOPED_TRACE(std::string("zero_stage ") + zero);
    Synced run({"own_experts",
                kTinyMoe + "training: {" + kBatch + "}\nparallel: {expert: " +
                    std::to_string(world_size()) + ", zero_stage: " + zero + ", bucket_mb: 0.02}\n",
                runtime::CommBackend::mpi});
    ASSERT_TRUE(run.own_experts);
    const OwnExperts& own = run.sync->own_experts();
    EXPECT_LT(own.first_tensor, run.model->params().size());
    EXPECT_LT(own.offset, run.elements());
    EXPECT_NE(run.model->params().spec(own.first_tensor).name.find(".mlp.experts."),
              std::string::npos);
    expect_reference_bits(run);
    std::uint64_t most = run.sync->moment_bytes();
    MPI_Allreduce(MPI_IN_PLACE, &most, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    PlanOptions options;
    options.zero_stage = run.sync->zero_stage();
    EXPECT_EQ(most, make_plan(run.cfg, run.layout, options).memory.optimizer)
        << "the plan's optimizer memory";
  }
}

TEST(GradSync, NamesTheRankWhoseGradientIsNotFinite) {
  // The last data rank writes a NaN into one gradient: its scan before the sum finds that
  // offset; no rank names another.
  Synced run(kCases[0]);
  const std::size_t at = run.elements() / 3;
  run.write_gradients(0);
  if (run.groups.data_rank == run.layout.data - 1)
    run.model->params().grads_data()[at] = std::numeric_limits<float>::quiet_NaN();
  run.sync->ready(0);
  run.sync->wait_all();
  const std::int64_t found = run.sync->first_nonfinite_offset();
  if (run.groups.data_rank == run.layout.data - 1) {
    EXPECT_EQ(found, static_cast<std::int64_t>(at));
  }
  EXPECT_TRUE(found == -1 || found == static_cast<std::int64_t>(at)) << found;
}

TEST(GradSync, RefusesWhatIsNotBuilt) {
  const config::RunConfig cfg =
      deck("model: {preset: tiny}\nparallel: {zero_stage: 1}\ntraining: {" + kBatch + "}\n");
  const config::Layout layout = config::resolve_layout(cfg, world_size());
  comm::ProcessGroups groups = comm::make_process_groups(MPI_COMM_WORLD, layout, 30.0);
  GradSync::Setup setup;
  setup.config = &cfg;
  setup.groups = &groups;
  setup.elements = 1024;
  // Own experts over shared memory: their sums over the expert-data group are not built.
  setup.own_experts = true;
  setup.backend = runtime::CommBackend::shm;
  try {
    GradSync::make(setup);
    ADD_FAILURE() << "own experts over shm were not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not built with the shm and nccl back ends"),
              std::string::npos)
        << e.what();
  }
  // ZeRO over NCCL (two or more data ranks; with one, ZeRO does nothing).
  if (world_size() > 1) {
    setup.own_experts = false;
    setup.backend = runtime::CommBackend::nccl;
    try {
      GradSync::make(setup);
      ADD_FAILURE() << "ZeRO over NCCL was not refused";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("needs the model in host memory and the mpi or shm"),
                std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace dst::train
