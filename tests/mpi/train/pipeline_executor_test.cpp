// The pipeline executor (train/pipeline_executor.hpp) over a fake stage at 1, 2 and 4 ranks
// (as 1, 2 and 4 stages; and 2 stages x 2 data ranks): each rank runs its schedule's
// operations in model::interleaved's order, activations flow forward through every virtual
// stage and gradients back, the last stage's losses and the first stage's gradients are
// the closed forms, the buckets start once per chunk, an evaluation passes every virtual
// stage, the two ends' embedding gradients are summed, and a missing peer ends in a
// TimeoutError naming the stage, the micro-batch and the peer's world rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "comm/mpi_communicator.hpp"
#include "comm/process_groups.hpp"
#include "core/error.hpp"
#include "model/pipeline_schedule.hpp"
#include "mpi_world.hpp"
#include "train/pipeline_executor.hpp"

namespace dst::train {
namespace {

using dst::test::world_rank;
using dst::test::world_size;

constexpr std::int64_t kRow = 6;  // floats per message

/// Virtual stage v = chunk x P + p adds v + 1 to every element of its input; the first
/// virtual stage's input is (micro + 1) x (i + 1). The last one's loss is the sum of its
/// output; its gradient is micro + 1 everywhere, and each virtual stage doubles the
/// gradient it passes back.
class FakeStage final : public PipelineStage {
 public:
  FakeStage(int stage, int stages, int chunks, std::int64_t micro_batches)
      : p_(stage),
        P_(stages),
        V_(chunks),
        m_(micro_batches),
        inputs_(static_cast<std::size_t>(chunks * micro_batches), std::vector<float>(kRow)),
        outputs_(inputs_),
        gradient_(kRow) {}

  std::size_t record(int chunk, std::int64_t micro) const override {
    return static_cast<std::size_t>(chunk * m_ + micro);
  }
  tensor::Tensor input(std::size_t r) const override { return view(inputs_[r]); }
  tensor::Tensor output(std::size_t r) const override { return view(outputs_[r]); }
  tensor::Tensor gradient() const override { return view(gradient_); }

  Forward forward(int chunk, std::int64_t micro, std::size_t r, bool with_gradient) override {
    ops.push_back({model::PipeOp::Kind::forward, micro, chunk});
    const int v = chunk * P_ + p_;
    const std::int64_t value = with_gradient ? micro : eval_batch;
    Forward f;
    for (std::int64_t i = 0; i < kRow; ++i) {
      const float x = v == 0 ? static_cast<float>((value + 1) * (i + 1))
                             : inputs_[r][static_cast<std::size_t>(i)];
      outputs_[r][static_cast<std::size_t>(i)] = x + static_cast<float>(v + 1);
      if (v == P_ * V_ - 1) f.loss_sum += outputs_[r][static_cast<std::size_t>(i)];
    }
    if (v == P_ * V_ - 1) {
      f.valid = kRow;
      f.mtp_loss_sum = 1.0;
    }
    return f;
  }

  double backward(std::size_t r, const std::function<void(std::size_t)>& on_ready) override {
    const int chunk = static_cast<int>(static_cast<std::int64_t>(r) / m_);
    const std::int64_t micro = static_cast<std::int64_t>(r) % m_;
    ops.push_back({model::PipeOp::Kind::backward, micro, chunk});
    const int v = chunk * P_ + p_;
    for (auto& g : gradient_)
      g = (v == P_ * V_ - 1 ? static_cast<float>(micro + 1) : g) * 2.0f;
    if (v == 0) first_gradients.push_back(gradient_[0]);
    if (on_ready) {
      on_ready(0);
      ++ready_calls;
    }
    return 0.0;
  }

  std::vector<model::PipeOp> ops;
  std::vector<float> first_gradients;  // virtual stage 0's, per backward in order
  int ready_calls = 0;
  std::int64_t eval_batch = 0;

 private:
  static tensor::Tensor view(const std::vector<float>& v) {
    tensor::Tensor t;
    t.data = const_cast<float*>(v.data());
    t.shape = tensor::Shape{static_cast<std::int64_t>(v.size())};
    return t;
  }
  int p_, P_, V_;
  std::int64_t m_;
  std::vector<std::vector<float>> inputs_, outputs_;
  std::vector<float> gradient_;
};

/// The world as `stages` pipeline stages x the rest data ranks; this rank's pipeline group.
struct Grid {
  config::Layout layout;
  std::unique_ptr<comm::MpiCommunicator> pipeline;
  MPI_Comm split = MPI_COMM_NULL;
  Grid(int stages, std::int64_t micro_batches, double timeout_s = 10.0) {
    layout.world_size = world_size();
    layout.pipeline = stages;
    layout.data = world_size() / stages;
    layout.grad_accum_steps = micro_batches;
    const comm::RankCoords me = comm::rank_coords(world_rank(), layout);
    MPI_Comm_split(MPI_COMM_WORLD, me.data, me.pipeline, &split);
    pipeline = std::make_unique<comm::MpiCommunicator>(split, "pipeline", timeout_s);
  }
  ~Grid() {
    pipeline.reset();
    MPI_Comm_free(&split);
  }
};

/// (micro + 1)(i + 1) through every virtual stage, summed over i.
double expected_loss(std::int64_t micro, int virtual_stages) {
  double sum = 0.0;
  for (std::int64_t i = 0; i < kRow; ++i)
    sum += static_cast<double>((micro + 1) * (i + 1)) +
           static_cast<double>(virtual_stages) * (virtual_stages + 1) / 2.0;
  return sum;
}

void run_schedule(int stages, int chunks, std::int64_t m) {
  if (world_size() % stages != 0) GTEST_SKIP() << stages << " stages do not divide the world";
  Grid grid(stages, m);
  const int p = grid.pipeline->rank();
  PipelineExecutor executor(*grid.pipeline, grid.layout, world_rank(), chunks);
  FakeStage stage(p, stages, chunks, m);
  int ready = 0;
  const PipelineExecutor::Totals t = executor.train(stage, [&](std::size_t) { ++ready; });
  EXPECT_EQ(stage.ops, model::interleaved(stages, p, chunks, m)) << "rank " << world_rank();
  EXPECT_EQ(ready, chunks) << "the buckets start once per chunk, on its last backward";
  const int VP = stages * chunks;
  if (p == stages - 1) {
    double want = 0.0;
    for (std::int64_t mb = 0; mb < m; ++mb)
      want += expected_loss(mb, VP);
    EXPECT_EQ(t.loss_sum, want);  // small integers: exact in any order
    EXPECT_EQ(t.valid, m * kRow);
    EXPECT_EQ(t.mtp_loss_sum, static_cast<double>(m));
  } else {
    EXPECT_EQ(t.loss_sum, 0.0);
    EXPECT_EQ(t.valid, 0);
    EXPECT_EQ(t.mtp_loss_sum, 0.0);
  }
  if (p == 0) {
    // Backwards in micro-batch order on the first virtual stage: (micro + 1) 2^VP.
    ASSERT_EQ(stage.first_gradients.size(), static_cast<std::size_t>(m));
    for (std::int64_t mb = 0; mb < m; ++mb)
      EXPECT_EQ(stage.first_gradients[static_cast<std::size_t>(mb)],
                static_cast<float>((mb + 1) * (1 << VP)))
          << "micro-batch " << mb;
  }
  // An evaluation batch through every virtual stage, twice (its messages numbered apart).
  for (std::int64_t b = 0; b < 2; ++b) {
    stage.eval_batch = b + 3;
    std::int64_t valid = 0;
    const double loss = executor.evaluate(stage, b, valid);
    EXPECT_EQ(loss, p == stages - 1 ? expected_loss(b + 3, VP) : 0.0);
    EXPECT_EQ(valid, p == stages - 1 ? kRow : 0);
  }
}

TEST(PipelineExecutor, OneFOneBRunsTheScheduleAndMovesTheMessages) {
  run_schedule(world_size() >= 2 ? 2 : 1, 1, 4);
}

TEST(PipelineExecutor, EveryRankAStage) {
  run_schedule(world_size(), 1, 3);
}

TEST(PipelineExecutor, InterleavedChunksPassThroughEveryVirtualStage) {
  if (world_size() < 2) GTEST_SKIP() << "interleaving needs two stages";
  // Micro-batches a multiple of the stages.
  run_schedule(2, 2, 4);
}

TEST(PipelineExecutor, SumsTheEmbeddingGradientOfTheTwoEnds) {
  if (world_size() < 2) GTEST_SKIP() << "one stage has no copy";
  const int stages = world_size();
  Grid grid(stages, 2);
  const int p = grid.pipeline->rank();
  PipelineExecutor executor(*grid.pipeline, grid.layout, world_rank(), 1);
  if (p != 0 && p != stages - 1) return;  // the middle stages hold no table
  std::vector<float> grads(5);
  for (std::size_t i = 0; i < grads.size(); ++i)
    grads[i] = static_cast<float>(p + 1) * static_cast<float>(i + 1);
  executor.sum_embedding_copies(grads.data(), grads.size());
  for (std::size_t i = 0; i < grads.size(); ++i)
    EXPECT_EQ(grads[i], static_cast<float>(stages + 1) * static_cast<float>(i + 1));
}

TEST(PipelineExecutor, ALatePeerEndsInATimeoutNamingIt) {
  if (world_size() != 2) GTEST_SKIP() << "two stages, one of them late";
  // Stage 1 takes stage 0's activations but sends the first gradient back only after 1.5 s:
  // stage 0's first backward waits for it until its 0.5 s deadline.
  Grid grid(2, 2, 0.5);
  const int p = grid.pipeline->rank();
  // The receive that timed out stays posted into the stage's gradient, which the late send
  // fills: the stage outlives the test on purpose.
  auto* stage = new FakeStage(0, 2, 1, 2);
  if (p == 1) {
    std::vector<float> sink(kRow);
    for (const int tag : {0, 2})  // micro-batches 1 and 2's activations
      grid.pipeline->irecv(sink.data(), kRow, DType::f32, 0, tag).wait();
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    grid.pipeline->isend(sink.data(), kRow, DType::f32, 0, 1).wait_for(0.0);
  } else {
    PipelineExecutor executor(*grid.pipeline, grid.layout, world_rank(), 1);
    try {
      executor.train(*stage, {});
      ADD_FAILURE() << "no timeout";
    } catch (const TimeoutError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("pipeline stage 0 waiting for the activation gradients of "
                          "micro-batch 1 from stage 1 (world rank 1)"),
                std::string::npos)
          << what;
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace dst::train
