// training.recompute: selective and full recompute give the loss and every gradient of
// recompute none bit for bit (MHA and GQA, latent attention with DeepSeekMoE, fp32 and
// emulated bf16, two accumulated micro-batches), and keep less: the activation arena
// shrinks by what is recomputed. MoE blocks count their expert loads and set the balance
// loss once per forward, recomputed or not.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/rng.hpp"
#include "model/language_model.hpp"

namespace {

using dst::DType;
using dst::config::Recompute;
using dst::model::LanguageModel;
using dst::tensor::Arena;

constexpr std::int64_t kB = 2, kT = 12;

dst::config::ModelSection model(std::int64_t kv_heads) {
  dst::config::ModelSection m;
  m.preset = "test";
  m.vocab_size = 37;
  m.d_model = 32;
  m.n_layers = 3;
  m.n_heads = 4;
  m.n_kv_heads = kv_heads;
  m.ffn_dim = 48;
  m.max_seq_len = 16;
  m.rope_theta = 10000.0;
  m.norm_eps = 1e-6;
  return m;
}

/// A tiny DeepSeek-V3-shaped model: latent attention (with a query latent), a dense first
/// block, then DeepSeekMoE blocks (sigmoid router with its correction bias, group-limited
/// top-2 of 8, one shared expert, the sequence-wise balance loss).
dst::config::ModelSection mla_moe_model() {
  auto m = model(4);
  m.q_lora_rank = 16;
  m.kv_lora_rank = 16;
  m.qk_nope_head_dim = 8;
  m.qk_rope_head_dim = 4;
  m.v_head_dim = 8;
  m.n_routed_experts = 8;
  m.n_shared_experts = 1;
  m.num_experts_per_tok = 2;
  m.moe_intermediate_size = 24;
  m.first_k_dense_replace = 1;
  m.n_group = 2;
  m.topk_group = 1;
  m.routed_scaling_factor = 2.5;
  m.moe.score = dst::config::MoeScore::sigmoid;
  m.moe.seq_aux_loss_alpha = 0.01;
  return m;
}

std::vector<std::int32_t> draw(std::uint64_t stream, std::int32_t vocab) {
  std::vector<std::int32_t> v;
  for (std::int64_t i = 0; i < kB * kT; ++i)
    v.push_back(
        static_cast<std::int32_t>(dst::core::uniform01(11, stream, static_cast<std::uint64_t>(i)) *
                                  static_cast<float>(vocab)));
  return v;
}

struct Result {
  std::vector<double> losses;
  std::vector<float> grads;
  std::vector<std::size_t> ready;  // the on_ready offsets, in order
  double eval_loss = 0.0;
  std::vector<double> moe_loads;  // after the two micro-batches and the evaluation
  double aux_loss = 0.0;          // the last training micro-batch's balance loss
  double mtp_loss = 0.0;          // the last training micro-batch's MTP loss sum
};

Result train_two_micro_batches(const dst::config::ModelSection& m, DType storage, Recompute r) {
  dst::model::ModelOptions options;
  options.storage = storage;
  options.recompute = r;
  LanguageModel net(m, kB, kT, Arena::Mode::allocate, options);
  net.params().initialize(3);
  net.refresh_compute_params();
  net.params().zero_grads();
  if (m.n_routed_experts > 0) {
    // A correction bias away from zero, so the routing uses it as training would.
    std::vector<double> loads(static_cast<std::size_t>(net.moe_blocks() * net.moe_experts()));
    for (std::size_t i = 0; i < loads.size(); ++i)
      loads[i] = static_cast<double>(i % 5);
    net.update_moe_bias(loads, 0.05);
  }
  Result out;
  dst::model::MicroBatchResult last;
  for (std::uint64_t micro = 0; micro < 2; ++micro) {
    const auto tokens = draw(2 * micro, static_cast<std::int32_t>(m.vocab_size));
    auto targets = draw(2 * micro + 1, static_cast<std::int32_t>(m.vocab_size));
    targets[5] = dst::model::kIgnoreIndex;
    last = net.forward_backward(tokens.data(), targets.data(), 0.25f,
                                [&](std::size_t o) { out.ready.push_back(o); });
    out.losses.push_back(last.loss_sum);
  }
  const std::size_t n = net.params().buffer_elements();
  out.grads.assign(net.params().grads_data(), net.params().grads_data() + n);
  const auto tokens = draw(7, static_cast<std::int32_t>(m.vocab_size));
  if (m.n_routed_experts > 0) out.aux_loss = last.aux_loss();
  out.mtp_loss = last.mtp_loss_sum;
  out.eval_loss = net.forward(tokens.data(), tokens.data()).loss_sum;
  if (m.n_routed_experts > 0) out.moe_loads = net.moe_loads();
  return out;
}

/// Every figure of `other` has the bits of `none`'s: the losses (training, evaluation,
/// balance, MTP), the gradients, the bucket-ready order and the expert loads (counted once
/// per forward, not again when a block is recomputed).
void expect_same_bits(const Result& other, const Result& none) {
  ASSERT_EQ(other.losses.size(), none.losses.size());
  for (std::size_t i = 0; i < none.losses.size(); ++i)
    EXPECT_EQ(std::memcmp(&other.losses[i], &none.losses[i], sizeof(double)), 0) << "loss " << i;
  EXPECT_EQ(std::memcmp(&other.eval_loss, &none.eval_loss, sizeof(double)), 0);
  EXPECT_EQ(std::memcmp(&other.aux_loss, &none.aux_loss, sizeof(double)), 0);
  EXPECT_EQ(std::memcmp(&other.mtp_loss, &none.mtp_loss, sizeof(double)), 0);
  ASSERT_EQ(other.grads.size(), none.grads.size());
  EXPECT_EQ(std::memcmp(other.grads.data(), none.grads.data(), none.grads.size() * sizeof(float)),
            0);
  EXPECT_EQ(other.ready, none.ready);
  EXPECT_EQ(other.moe_loads, none.moe_loads);
}

TEST(Recompute, GradientsAndLossesAreBitIdenticalToKeepingEverything) {
  for (const std::int64_t kv : {4, 2, 1}) {  // MHA and GQA
    for (const DType storage : {DType::f32, DType::bf16}) {
      const auto m = model(kv);
      const Result none = train_two_micro_batches(m, storage, Recompute::none);
      for (const Recompute r : {Recompute::selective, Recompute::full}) {
        SCOPED_TRACE("kv_heads " + std::to_string(kv) + ", " +
                     std::string(dst::dtype_name(storage)) + ", " + dst::to_string(r));
        expect_same_bits(train_two_micro_batches(m, storage, r), none);
      }
    }
  }
}

TEST(Recompute, LatentAttentionAndMoeAreBitIdenticalAndCountLoadsOnce) {
  const auto m = mla_moe_model();
  for (const DType storage : {DType::f32, DType::bf16}) {
    const Result none = train_two_micro_batches(m, storage, Recompute::none);
    // Three forwards (two micro-batches, one evaluation) of kB*kT tokens, top-2, per block.
    double routed = 0.0;
    for (const double l : none.moe_loads)
      routed += l;
    ASSERT_EQ(none.moe_loads.size(), static_cast<std::size_t>((m.n_layers - 1) * 8));
    EXPECT_EQ(routed, static_cast<double>((m.n_layers - 1) * 3 * kB * kT * 2));
    EXPECT_GT(none.aux_loss, 0.0);
    for (const Recompute r : {Recompute::selective, Recompute::full}) {
      SCOPED_TRACE(std::string(dst::dtype_name(storage)) + ", " + dst::to_string(r));
      expect_same_bits(train_two_micro_batches(m, storage, r), none);
    }
  }
}

// With a multi-token prediction module (its block an MLA/MoE block too, sharing the
// recomputed record): the same bits under every setting, and its block's expert loads
// counted once, after the model's MoE blocks.
TEST(Recompute, MultiTokenPredictionIsBitIdenticalAndCountsLoadsOnce) {
  auto m = mla_moe_model();
  m.mtp_depth = 1;
  for (const DType storage : {DType::f32, DType::bf16}) {
    const Result none = train_two_micro_batches(m, storage, Recompute::none);
    ASSERT_EQ(none.moe_loads.size(), static_cast<std::size_t>(m.n_layers * 8));
    double routed = 0.0;
    for (const double l : none.moe_loads)
      routed += l;
    EXPECT_EQ(routed, static_cast<double>(m.n_layers * 3 * kB * kT * 2));
    for (const Recompute r : {Recompute::selective, Recompute::full}) {
      SCOPED_TRACE(std::string(dst::dtype_name(storage)) + ", " + dst::to_string(r));
      expect_same_bits(train_two_micro_batches(m, storage, r), none);
    }
  }
}

TEST(Recompute, LatentAttentionAndMoeKeepLess) {
  const auto m = mla_moe_model();
  const auto mem = [&](Recompute r) {
    dst::model::ModelOptions o;
    o.recompute = r;
    return LanguageModel(m, kB, kT, Arena::Mode::plan, o).memory();
  };
  const auto none = mem(Recompute::none), selective = mem(Recompute::selective),
             full = mem(Recompute::full);
  const std::uint64_t probs = static_cast<std::uint64_t>(kB * m.n_heads * kT * kT) * sizeof(float);
  EXPECT_EQ(none.activations - selective.activations,
            static_cast<std::uint64_t>(m.n_layers) * probs);
  EXPECT_EQ(selective.recompute, probs);
  EXPECT_LT(full.activations + full.recompute, selective.activations + selective.recompute);
  EXPECT_EQ(none.workspace, full.workspace);
}

TEST(Recompute, KeepsLessActivationMemory) {
  const auto m = model(2);
  const std::int64_t N = kB * kT, C = m.d_model, H = m.n_heads, L = m.n_layers;
  const auto mem = [&](Recompute r) {
    dst::model::ModelOptions o;
    o.recompute = r;
    return LanguageModel(m, kB, kT, Arena::Mode::plan, o).memory();
  };
  const auto none = mem(Recompute::none), selective = mem(Recompute::selective),
             full = mem(Recompute::full);
  const std::uint64_t probs = static_cast<std::uint64_t>(kB * H * kT * kT) * sizeof(float);
  EXPECT_EQ(none.recompute, 0u);
  // selective: the layers keep no probabilities; one layer's worth is shared.
  EXPECT_EQ(none.activations - selective.activations, static_cast<std::uint64_t>(L) * probs);
  EXPECT_EQ(selective.recompute, probs);
  // full: each block keeps its input (N, C) only; one block's record is shared.
  EXPECT_EQ(none.activations - full.activations, static_cast<std::uint64_t>(L) * full.recompute);
  EXPECT_GT(full.recompute, 8 * static_cast<std::uint64_t>(N * C) * sizeof(float));
  EXPECT_LT(full.activations + full.recompute, selective.activations + selective.recompute);
  EXPECT_LT(selective.activations + selective.recompute, none.activations);
  EXPECT_EQ(none.workspace, full.workspace);
  EXPECT_EQ(none.parameters, full.parameters);
}

}  // namespace
