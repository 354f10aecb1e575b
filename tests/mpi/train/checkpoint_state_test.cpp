// The checkpoint state (train/checkpoint_state.hpp) at 1, 2 and 4 ranks: whatever part of
// the model a rank holds (the whole of it, ZeRO-1's shard of the moments, tensor slices,
// pipeline stages, own experts), a save streams the whole model's tensors in a one-stage
// run's order, each the same on every rank and equal to a one-rank reference; written to a
// real checkpoint file and read into a fresh state, every rank gets its part back; a
// checkpoint without the moments is refused naming them.
#include <gtest/gtest.h>
#include <mpi.h>

#include <unistd.h>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/checkpoint.hpp"
#include "config/deck.hpp"
#include "model/stage.hpp"
#include "mpi_world.hpp"
#include "train/checkpoint_state.hpp"

namespace dst::train {
namespace {

using dst::test::world_rank;
using dst::test::world_size;

struct Case {
  const char* name;
  std::string deck;  ///< model and parallel sections
  int world;         ///< the world size it needs (it runs on multiples of it)
};

const std::string kTiny = dst::test::kQuarterTiny;  // mpi_world.hpp
const std::string kTinyMoe = dst::test::kQuarterTinyMoe;

const Case kCases[] = {
    {"whole", kTiny + "parallel: {}\n", 1},
    {"zero1", kTiny + "parallel: {zero_stage: 1}\n", 2},
    {"tp2", kTiny + "parallel: {tensor: 2}\n", 2},
    {"pp2", kTiny + "parallel: {pipeline: 2}\n", 2},
    {"ep2", kTinyMoe + "parallel: {expert: 2}\n", 2},
    {"pp2_ep2_zero1", kTinyMoe + "parallel: {pipeline: 2, expert: 2, zero_stage: 1}\n", 4},
    {"tp2_pp2", kTiny + "parallel: {tensor: 2, pipeline: 2}\n", 4},
};

/// One rank's part of the model: its store, the strategy that holds its optimizer state,
/// and the checkpoint state over them.
struct Part {
  config::RunConfig cfg;
  config::Layout layout;
  comm::ProcessGroups groups;
  bool own_experts = false;
  std::unique_ptr<GradSync> sync;
  std::unique_ptr<model::ParamStore> store;
  std::unique_ptr<WholeModel> whole;
  std::unique_ptr<CheckpointState> state;

  explicit Part(const Case& c)
      : cfg(config::load_deck_text(std::string(c.deck) +
                                       "data: {seq_len: 8}\ntraining: {micro_batch_size: 1, "
                                       "global_batch_size: 8}\n",
                                   "checkpoint_state_test")),
        layout(config::resolve_layout(cfg, world_size())),
        groups(comm::make_process_groups(MPI_COMM_WORLD, layout, 30.0)) {
    const int stage = groups.pipeline_rank;
    own_experts = layout.expert > 1 && model::own_expert_storage(cfg, stage);
    const std::vector<model::StageBlocks> chunks =
        layout.pipeline > 1 ? model::rank_chunks(cfg, stage, layout.grad_accum_steps)
                            : std::vector<model::StageBlocks>{model::StageBlocks::whole()};
    const model::TensorSlice slice{groups.tensor_rank, layout.tensor, false};
    const model::ExpertSlice experts{own_experts ? groups.expert_rank : 0,
                                     own_experts ? layout.expert : 1};
    const auto specs = model::stage_parameter_layout(cfg.model, chunks, slice, experts);
    GradSync::Setup setup;
    setup.config = &cfg;
    setup.groups = &groups;
    setup.elements = model::flat_buffer_elements(specs);
    setup.own_experts = own_experts;
    sync = GradSync::make(setup);
    store = std::make_unique<model::ParamStore>(specs, tensor::Arena::Mode::allocate);
    sync->attach(*store);
    whole = std::make_unique<WholeModel>(cfg, layout, stage, own_experts);
    state =
        std::make_unique<CheckpointState>(cfg, layout, groups, *store, *sync, *whole, own_experts);
  }

  /// Parameters from `seed`, first moments 2 p and second p^2 (element by element, so
  /// a slice's are the whole tensor's at the same logical elements).
  void set(std::uint64_t seed) {
    store->initialize(seed);
    const GradSync::State s = sync->to_restore();
    const std::size_t n = store->buffer_elements();
    for (std::size_t i = 0; i < n; ++i) {
      const float p = store->params_data()[i];
      s.params[i] = p;
      s.m[i] = 2.0f * p;
      s.v[i] = p * p;
    }
    sync->restored(5);
  }
};

/// The whole model's tensor `name` as set(seed) makes it, from a one-rank store.
std::vector<float> expected(const model::ParamStore& reference, const std::string& name) {
  const std::string params = "params/", m = "optimizer/exp_avg/", v = "optimizer/exp_avg_sq/";
  const bool is_m = name.rfind(m, 0) == 0, is_v = name.rfind(v, 0) == 0;
  const std::string tensor = name.substr(is_m ? m.size() : is_v ? v.size() : params.size());
  const tensor::Tensor t = reference.param(reference.index_of(tensor));
  const float* p = t.ptr<float>();
  std::vector<float> out(static_cast<std::size_t>(t.shape.numel()));
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = is_m ? 2.0f * p[i] : is_v ? p[i] * p[i] : p[i];
  return out;
}

/// Streams the whole state and compares every tensor with the reference's, and with rank
/// 0's; returns how many tensors differ.
int stream_differences(const Part& part, const model::ParamStore& reference) {
  const CheckpointStream s = part.state->stream(false);
  EXPECT_EQ(s.tensors.size(), 3 * reference.size());
  int wrong = 0;
  for (std::size_t i = 0; i < s.tensors.size(); ++i) {
    const std::vector<float> want = expected(reference, s.tensors[i].name);
    const float* got = s.source(i);
    if (std::memcmp(got, want.data(), want.size() * sizeof(float)) != 0) {
      ++wrong;
      ADD_FAILURE() << "rank " << world_rank() << ": " << s.tensors[i].name << " differs";
    }
  }
  return wrong;
}

/// A directory every rank names alike (rank 0's process id).
std::string shared_dir(const std::string& what) {
  long pid = static_cast<long>(::getpid());
  MPI_Bcast(&pid, 1, MPI_LONG, 0, MPI_COMM_WORLD);
  return ::testing::TempDir() + "dst-checkpoint-state-" + what + "-" + std::to_string(pid);
}

TEST(CheckpointState, EveryLayoutSavesAndRestoresTheWholeModel) {
  int ran = 0;
  for (const Case& c : kCases) {
    if (world_size() % c.world != 0) continue;
    SCOPED_TRACE(c.name);
    ++ran;
    Part part(c);
    model::ParamStore reference(model::dense_parameter_layout(part.cfg.model),
                                tensor::Arena::Mode::allocate);
    reference.initialize(11);
    part.set(11);
    EXPECT_EQ(part.whole->layout() != nullptr,
              part.layout.tensor > 1 || part.layout.pipeline > 1 || part.own_experts);
    EXPECT_EQ(stream_differences(part, reference), 0);
    // Through a real file, into a fresh part whose parameters came from another seed.
    const std::string dir = shared_dir(c.name);
    ckpt::Directory directory(MPI_COMM_WORLD, dir, 60.0);
    ckpt::Metadata meta;
    meta.step = 5;
    meta.optimizer_steps = 5;
    const CheckpointStream s = part.state->stream(false);
    directory.save(meta, s.tensors, s.source, 0);
    Part fresh(c);
    fresh.store->initialize(12);
    {
      ckpt::Reader reader(MPI_COMM_WORLD, directory.latest(), 60.0);
      fresh.state->read(reader);
    }
    fresh.sync->restored(5);
    EXPECT_EQ(fresh.sync->optimizer_steps(), 5);
    EXPECT_EQ(std::memcmp(fresh.store->params_data(), part.store->params_data(),
                          part.store->buffer_elements() * sizeof(float)),
              0)
        << "this rank's parameters after the read";
    EXPECT_EQ(stream_differences(fresh, reference), 0) << "after the read";
    // A checkpoint of the parameters alone lacks the moments: refused, naming them.
    const std::string params_dir = shared_dir(std::string(c.name) + "-params");
    ckpt::Directory params_only(MPI_COMM_WORLD, params_dir, 60.0);
    const CheckpointStream p = part.state->stream(true);
    EXPECT_EQ(p.tensors.size(), reference.size());
    params_only.save(meta, p.tensors, p.source, 0);
    try {
      ckpt::Reader reader(MPI_COMM_WORLD, params_only.latest(), 60.0);
      fresh.state->read(reader);
      ADD_FAILURE() << "a checkpoint without moments was read";
    } catch (const ckpt::CheckpointError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("does not match this model (" + std::to_string(2 * reference.size()) +
                          " tensors)"),
                std::string::npos)
          << what;
      EXPECT_NE(what.find("optimizer/exp_avg/model.norm.weight: missing from the checkpoint"),
                std::string::npos)
          << what;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) {
      std::filesystem::remove_all(dir);
      std::filesystem::remove_all(params_dir);
    }
  }
  EXPECT_GT(ran, 0);
}

}  // namespace
}  // namespace dst::train
