// The logged loss of a training step is the mean over every real target token of the
// whole global batch (all micro-batches of all ranks), weighted by token count: with
// samples padded unevenly, a mean of per-rank or per-micro-batch means would differ
// ("honest global loss"). Run at 1, 2 and 4 ranks on the same global batch.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "config/deck.hpp"
#include "model/language_model.hpp"
#include "train/trainer.hpp"

namespace dst::train {
namespace {

constexpr std::int64_t kT = 32;
constexpr std::uint64_t kSamples = 16;

/// Sample i: tokens from a fixed formula, right-padded with kIgnoreIndex over its last
/// pad(i) positions, pad(i) different for every sample (0 .. 30 of 33 positions).
class PaddedStore final : public data::SampleStore {
 public:
  static std::int64_t pad(std::uint64_t id) { return static_cast<std::int64_t>((id * 11) % 31); }
  std::uint64_t num_samples() const override { return kSamples; }
  void read(const std::vector<std::uint64_t>& ids, std::int32_t* out) override {
    for (std::size_t i = 0; i < ids.size(); ++i) {
      std::int32_t* row = out + i * (kT + 1);
      for (std::int64_t t = 0; t <= kT; ++t)
        row[t] = t > kT - pad(ids[i]) ? model::kIgnoreIndex
                                      : static_cast<std::int32_t>((ids[i] * 37 + t * 13) % 250);
    }
  }
};

config::RunConfig deck() {
  return config::load_deck_text(
      "model: {preset: tiny, d_model: 64, n_layers: 2, n_heads: 4, n_kv_heads: 2, ffn_dim: 96,"
      " max_seq_len: 32}\n"
      "data: {seq_len: 32}\n"
      "training: {global_batch_size: 8, micro_batch_size: 2, max_steps: 3}\n"
      "debug: {consistency_every: 0}\n",
      "trainer_loss_test");
}

TEST(TrainerLoss, IsTheTokenWeightedMeanOfTheGlobalBatchWithUnevenPadding) {
  const config::RunConfig cfg = deck();
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const config::Layout layout = config::resolve_layout(cfg, world);
  comm::ProcessGroups groups = comm::make_process_groups(MPI_COMM_WORLD, layout, 60.0);
  PaddedStore store;
  Trainer trainer(cfg, layout, groups, store);
  trainer.initialize_parameters();

  // The reference: the same initial parameters, every sample of the step's global batch
  // scored on its own on this rank.
  const std::vector<std::uint64_t> batch =
      trainer.sampler().global_batch(trainer.sampler().position());
  ASSERT_EQ(batch.size(), 8u);
  model::LanguageModel ref(cfg.model, 1, kT, tensor::Arena::Mode::allocate);
  ref.params().initialize(cfg.run.seed);
  double loss_sum = 0.0, mean_of_means = 0.0;
  std::int64_t tokens = 0;
  std::vector<std::int32_t> row(kT + 1), in(kT), target(kT);
  for (const std::uint64_t id : batch) {
    store.read({id}, row.data());
    for (std::int64_t t = 0; t < kT; ++t) {
      in[t] = row[t] == model::kIgnoreIndex ? 0 : row[t];
      target[t] = row[t + 1];
    }
    const model::MicroBatchResult r = ref.forward(in.data(), target.data());
    const double s = r.loss_sum;
    const std::int64_t v = r.valid_tokens;
    EXPECT_EQ(v, kT - PaddedStore::pad(id)) << "sample " << id;
    loss_sum += s;
    tokens += v;
    mean_of_means += s / static_cast<double>(v) / static_cast<double>(batch.size());
  }
  const double expected = loss_sum / static_cast<double>(tokens);

  const StepStats st = trainer.step();
  EXPECT_EQ(st.tokens, tokens);
  constexpr double kTol = 1e-6;  // fp32 sums in another order
  EXPECT_NEAR(st.loss, expected, kTol * expected) << "world " << world;
  // The test can tell a token-weighted mean from a mean of means on this data: at
  // initialisation every token's loss is near ln(260), yet the two differ by 3e-4.
  EXPECT_GT(std::fabs(mean_of_means - expected), 100 * kTol * expected);
}

}  // namespace
}  // namespace dst::train
