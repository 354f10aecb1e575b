// The dense model: layout, deterministic initialisation, and gradients of the whole
// model against central finite differences.
#include <gtest/gtest.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "model/language_model.hpp"
#include "model/layers/multi_token_prediction.hpp"
#include "model/plan.hpp"

namespace {

using dst::model::LanguageModel;
using dst::model::MicroBatchResult;
using dst::tensor::Arena;

/// A model's options storing parameters and activations as `storage`.
dst::model::ModelOptions stored_as(dst::DType storage) {
  dst::model::ModelOptions o;
  o.storage = storage;
  return o;
}

class KokkosEnvironment : public ::testing::Environment {
 public:
  void SetUp() override { Kokkos::initialize(); }
  void TearDown() override { Kokkos::finalize(); }
};
const auto* const kKokkos = ::testing::AddGlobalTestEnvironment(new KokkosEnvironment);

dst::config::ModelSection small_gqa() {
  dst::config::ModelSection m;
  m.preset = "test";
  m.vocab_size = 11;
  m.d_model = 8;
  m.n_layers = 2;
  m.n_heads = 2;
  m.n_kv_heads = 1;
  m.ffn_dim = 12;
  m.max_seq_len = 8;
  m.rope_theta = 10000.0;
  m.norm_eps = 1e-6;
  return m;
}

struct Batch {
  std::vector<std::int32_t> tokens, targets;
};

Batch make_batch(std::int64_t n, std::int32_t vocab, std::uint64_t seed) {
  Batch b;
  for (std::int64_t i = 0; i < n; ++i) {
    const auto u = [&](std::uint64_t s) {
      return static_cast<std::int32_t>(
          dst::core::uniform01(seed, s, static_cast<std::uint64_t>(i)) * static_cast<float>(vocab));
    };
    b.tokens.push_back(u(1));
    b.targets.push_back(i % 4 == 1 ? dst::model::kIgnoreIndex : u(2));
  }
  return b;
}

TEST(LanguageModel, PlanAndAllocationAgree) {
  const auto m = small_gqa();
  const LanguageModel plan(m, 2, 5, Arena::Mode::plan);
  LanguageModel real(m, 2, 5, Arena::Mode::allocate);
  const auto a = plan.memory();
  const auto b = real.memory();
  EXPECT_EQ(a.parameters, b.parameters);
  EXPECT_EQ(a.activations, b.activations);
  EXPECT_EQ(a.workspace, b.workspace);
  EXPECT_EQ(plan.params().parameter_count(), dst::model::count_parameters(m).total());
  EXPECT_THROW(const_cast<LanguageModel&>(plan).forward(nullptr, nullptr), dst::Error);
}

TEST(LanguageModel, ParameterLayoutMatchesClosedFormForEveryShape) {
  auto m = small_gqa();
  for (bool tied : {false, true}) {
    m.tie_embeddings = tied;
    const LanguageModel plan(m, 1, 1, Arena::Mode::plan);
    EXPECT_EQ(plan.params().parameter_count(), dst::model::count_parameters(m).total());
    // Every tensor starts on a 64-byte boundary.
    for (const auto& s : plan.params().specs())
      EXPECT_EQ(s.offset % 16, 0u) << s.name;
  }
}

TEST(LanguageModel, InitialisationIsAPureFunctionOfSeedNameAndIndex) {
  const auto m = small_gqa();
  LanguageModel a(m, 1, 4, Arena::Mode::allocate);
  LanguageModel b(m, 1, 4, Arena::Mode::allocate);
  a.params().initialize(42);
  b.params().initialize(42);
  const auto bytes = a.params().buffer_elements() * sizeof(float);
  EXPECT_EQ(std::memcmp(a.params().params_data(), b.params().params_data(), bytes), 0);
  const auto i = a.params().index_of("model.layers.1.self_attn.o_proj.weight");
  const auto& spec = a.params().spec(i);
  // Output projections are scaled by 1/sqrt(2 L).
  EXPECT_FLOAT_EQ(spec.std, 0.02f / std::sqrt(4.0f));
  EXPECT_EQ(a.params().param(i).ptr<float>()[5],
            spec.std * dst::core::normal(42, dst::core::hash_name(spec.name), 5));
  EXPECT_EQ(a.params().param("model.norm.weight").ptr<float>()[0], 1.0f);
  b.params().initialize(43);
  EXPECT_NE(std::memcmp(a.params().params_data(), b.params().params_data(), bytes), 0);
}

TEST(LanguageModel, InitialisationIsTheSameOnAnyNumberOfThreads) {
  // Tensors long enough to be split (embedding 500 x 320 = 160000 values, three slices of
  // at least 2^16 on up to 3 threads), drawn on 1, 2, 3 and 7 threads: the same bits. One
  // block with a narrow MLP keeps the rest small (the draws take seconds under ASan).
  auto m = small_gqa();
  m.vocab_size = 500;
  m.d_model = 320;
  m.n_layers = 1;
  m.n_heads = 4;
  m.n_kv_heads = 2;
  m.ffn_dim = 64;
  LanguageModel one(m, 1, 4, Arena::Mode::allocate);
  one.params().initialize(5, 1);
  const auto bytes = one.params().buffer_elements() * sizeof(float);
  for (const unsigned threads : {2u, 3u, 7u, 0u}) {
    LanguageModel many(m, 1, 4, Arena::Mode::allocate);
    many.params().initialize(5, threads);
    EXPECT_EQ(std::memcmp(one.params().params_data(), many.params().params_data(), bytes), 0)
        << threads << " threads";
  }
  const auto i = one.params().index_of("model.embed_tokens.weight");
  const auto& spec = one.params().spec(i);
  EXPECT_EQ(one.params().param(i).ptr<float>()[159999],
            spec.std * dst::core::normal(5, dst::core::hash_name(spec.name), 159999));
}

TEST(LanguageModel, BackwardIsBitwiseDeterministicAndAccumulates) {
  const auto m = small_gqa();
  LanguageModel model(m, 2, 5, Arena::Mode::allocate);
  model.params().initialize(7);
  const Batch batch = make_batch(10, 11, 3);
  const auto n = model.params().buffer_elements();
  model.params().zero_grads();
  const double l1 =
      model.forward_backward(batch.tokens.data(), batch.targets.data(), 0.5f).loss_sum;
  const std::vector<float> g1(model.params().grads_data(), model.params().grads_data() + n);
  model.params().zero_grads();
  const double l2 =
      model.forward_backward(batch.tokens.data(), batch.targets.data(), 0.5f).loss_sum;
  EXPECT_EQ(l1, l2);
  EXPECT_EQ(std::memcmp(g1.data(), model.params().grads_data(), n * sizeof(float)), 0);
  // Without zeroing, a second micro-batch adds to the gradients. Not bit-exactly 2 g: a
  // gradient that is itself a sum (several tokens, GEMM k-blocks) now adds its terms to
  // g one by one; each addition rounds once (fp32: 6e-8 relative), a few dozen at most.
  model.forward_backward(batch.tokens.data(), batch.targets.data(), 0.5f);
  for (std::size_t i = 0; i < n; ++i)
    ASSERT_NEAR(model.params().grads_data()[i], 2.0f * g1[i], 4e-6f * std::fabs(g1[i]) + 1e-12f)
        << i;
}

TEST(LanguageModel, IgnoredTargetsContributeNothing) {
  const auto m = small_gqa();
  LanguageModel model(m, 1, 6, Arena::Mode::allocate);
  model.params().initialize(1);
  Batch batch = make_batch(6, 11, 9);
  std::fill(batch.targets.begin(), batch.targets.end(), dst::model::kIgnoreIndex);
  model.params().zero_grads();
  const MicroBatchResult r =
      model.forward_backward(batch.tokens.data(), batch.targets.data(), 1.0f);
  EXPECT_EQ(r.loss_sum, 0.0);
  EXPECT_EQ(r.valid_tokens, 0);
  for (std::size_t i = 0; i < model.params().buffer_elements(); ++i)
    ASSERT_EQ(model.params().grads_data()[i], 0.0f);
}

/// Parameters away from their 0.02 init (std ~0.3) so every gradient is well above the
/// central differences' noise floor; norm weights away from 1 so theirs are exercised too.
void spread_parameters(dst::model::ParamStore& ps) {
  for (std::size_t i = 0; i < ps.size(); ++i) {
    float* w = ps.param(i).ptr<float>();
    const bool norm = ps.spec(i).init != dst::model::Init::normal;
    for (std::int64_t j = 0; j < ps.param(i).numel(); ++j)
      w[j] = norm ? 1.0f + 0.3f * dst::core::normal(5, i, static_cast<std::uint64_t>(j))
                  : 15.0f * w[j];
  }
}

/// `grads` / valid (the gradient of a sum over `valid` tokens) against central differences
/// (h = 1e-2) of `objective` at four elements of every parameter, drawn with `seed`.
/// Returns how many elements were checked. The tolerance is the one argued at
/// GradientsMatchCentralDifferences.
int expect_sampled_gradients(dst::model::ParamStore& ps, const std::vector<float>& grads,
                             std::int64_t valid, std::uint64_t seed,
                             const std::function<double()>& objective) {
  const float h = 1e-2f;
  int checked = 0;
  for (std::size_t i = 0; i < ps.size(); ++i) {
    const auto& spec = ps.spec(i);
    float* w = ps.param(i).ptr<float>();
    const auto n = static_cast<std::uint64_t>(ps.param(i).numel());
    for (std::uint64_t s = 0; s < 4; ++s) {
      const auto j =
          static_cast<std::int64_t>(dst::core::uniform01(seed, i, s) * static_cast<float>(n));
      const float saved = w[j];
      w[j] = saved + h;
      const double up = objective();
      w[j] = saved - h;
      const double down = objective();
      w[j] = saved;
      const double fd = (up - down) / (2.0 * static_cast<double>(h));
      const double analytic =
          grads[spec.offset + static_cast<std::size_t>(j)] / static_cast<double>(valid);
      EXPECT_NEAR(analytic, fd, 3e-4 + 3e-2 * std::fabs(fd)) << spec.name << "[" << j << "]";
      ++checked;
    }
  }
  return checked;
}

// Whole-model gradients against central differences of the mean loss, for a sample of
// elements of every parameter tensor. Weights are scaled up from the 0.02 init (to
// std ~0.3) so every gradient is well above the differences' noise floor. Tolerance:
// per-token losses are fp32 (relative error ~1e-7 of a loss ~2.4), so with h = 1e-2 the
// difference quotient carries ~1e-5 of rounding noise; truncation is O(h^2 f''') ~1e-5;
// 3e-4 absolute + 3% relative covers both with margin and still fails for any wrong
// term (a missing factor or transpose is off by far more).
TEST(LanguageModel, GradientsMatchCentralDifferences) {
  const auto m = small_gqa();
  const std::int64_t B = 2, T = 5;
  LanguageModel model(m, B, T, Arena::Mode::allocate);
  auto& ps = model.params();
  ps.initialize(11);
  spread_parameters(ps);
  const Batch batch = make_batch(B * T, 11, 21);
  ps.zero_grads();
  const std::int64_t valid =
      model.forward_backward(batch.tokens.data(), batch.targets.data(), 1.0f).valid_tokens;
  ASSERT_GT(valid, 0);
  // Gradients of the mean: forward_backward's grad_scale = 1 accumulates d(sum); divide.
  const std::vector<float> grads(ps.grads_data(), ps.grads_data() + ps.buffer_elements());
  auto mean_loss = [&] {
    return model.forward(batch.tokens.data(), batch.targets.data()).loss_sum /
           static_cast<double>(valid);
  };
  const int checked = expect_sampled_gradients(ps, grads, valid, 99, mean_loss);
  EXPECT_EQ(checked, static_cast<int>(4 * ps.size()));
}

}  // namespace

// training.precision bf16 / fp16 on the host: the model computes with a rounded compute
// copy of the parameters and rounds its activations (docs/precision.md).
namespace {
TEST(LanguageModelPrecision, F32IsUnchangedAnd16BitStorageIsCloseButNotEqual) {
  const auto m = small_gqa();
  const Batch batch = make_batch(10, 11, 3);
  LanguageModel plain(m, 2, 5, Arena::Mode::allocate);
  plain.params().initialize(7);
  plain.params().zero_grads();
  const double ref =
      plain.forward_backward(batch.tokens.data(), batch.targets.data(), 0.5f).loss_sum;
  const auto n = plain.params().buffer_elements();
  for (const dst::DType st : {dst::DType::f32, dst::DType::bf16, dst::DType::f16}) {
    LanguageModel model(m, 2, 5, Arena::Mode::allocate, stored_as(st));
    EXPECT_EQ(model.storage(), st);
    model.params().initialize(7);
    model.refresh_compute_params();
    model.params().zero_grads();
    const double loss =
        model.forward_backward(batch.tokens.data(), batch.targets.data(), 0.5f).loss_sum;
    const float* g = model.params().grads_data();
    const float* g0 = plain.params().grads_data();
    if (st == dst::DType::f32) {  // explicit f32 = the default, bit for bit
      EXPECT_EQ(loss, ref);
      EXPECT_EQ(std::memcmp(g, g0, n * sizeof(float)), 0);
      continue;
    }
    // Rounding happened (a model that ignored its storage type would match exactly), and
    // stays small: 8 (bf16) or 11 (fp16) significant bits on O(1) activations through 2
    // layers move the loss sum (7 tokens, ~17 nats) by well under 1%.
    EXPECT_NE(loss, ref) << dst::dtype_name(st);
    EXPECT_NEAR(loss, ref, 1e-2 * std::fabs(ref)) << dst::dtype_name(st);
    double dot = 0, n0 = 0, n1 = 0;
    for (std::size_t i = 0; i < n; ++i) {
      dot += static_cast<double>(g[i]) * g0[i];
      n0 += static_cast<double>(g0[i]) * g0[i];
      n1 += static_cast<double>(g[i]) * g[i];
    }
    EXPECT_GT(dot / std::sqrt(n0 * n1), 0.999) << dst::dtype_name(st);  // same direction
  }
}

TEST(LanguageModelPrecision, ComputeCopyFollowsTheMasterOnlyWhenRefreshed) {
  const auto m = small_gqa();
  const Batch batch = make_batch(10, 11, 3);
  LanguageModel a(m, 2, 5, Arena::Mode::allocate, stored_as(dst::DType::bf16));
  LanguageModel b(m, 2, 5, Arena::Mode::allocate, stored_as(dst::DType::bf16));
  a.params().initialize(7);
  a.refresh_compute_params();
  b.params().initialize(8);
  b.refresh_compute_params();
  const double la = a.forward(batch.tokens.data(), batch.targets.data()).loss_sum;
  const double lb = b.forward(batch.tokens.data(), batch.targets.data()).loss_sum;
  ASSERT_NE(la, lb);
  a.params().initialize(8);  // the master changes; the compute copy does not yet
  EXPECT_EQ(a.forward(batch.tokens.data(), batch.targets.data()).loss_sum, la);
  a.refresh_compute_params();
  EXPECT_EQ(a.forward(batch.tokens.data(), batch.targets.data()).loss_sum, lb);
}
}  // namespace

// ZeRO with bf16/fp16 (master_outside): the parameter buffer is the compute copy, rounded
// in place, and a shard refreshed from its master gives the same forward and gradients
// bit for bit as the model that keeps its own master.
namespace {
TEST(LanguageModelPrecision, MasterOutsideComputesWithTheSameBits) {
  const auto m = small_gqa();
  const Batch batch = make_batch(10, 11, 3);
  for (const dst::DType st : {dst::DType::bf16, dst::DType::f16}) {
    dst::model::ModelOptions o = stored_as(st);
    LanguageModel own(m, 2, 5, Arena::Mode::allocate, o);
    o.master_outside = true;
    LanguageModel outside(m, 2, 5, Arena::Mode::allocate, o);
    own.params().initialize(7);
    own.refresh_compute_params();
    outside.params().initialize(7);
    const std::size_t n = own.params().buffer_elements();
    const std::vector<float> master(own.params().params_data(), own.params().params_data() + n);
    outside.refresh_compute_params();  // rounds the buffer in place
    EXPECT_NE(std::memcmp(outside.params().params_data(), master.data(), n * sizeof(float)), 0);
    const auto loss_and_grads = [&](LanguageModel& model) {
      model.params().zero_grads();
      const double loss =
          model.forward_backward(batch.tokens.data(), batch.targets.data(), 0.5f).loss_sum;
      return std::make_pair(
          loss, std::vector<float>(model.params().grads_data(), model.params().grads_data() + n));
    };
    const auto ref = loss_and_grads(own);
    EXPECT_EQ(loss_and_grads(outside), ref) << dst::dtype_name(st);
    // A changed master, refreshed in two shards (the second empty, then the rest).
    std::vector<float> next(master);
    for (float& x : next)
      x *= 1.0625f;
    std::copy(next.begin(), next.end(), own.params().params_data());
    own.refresh_compute_params();
    const std::size_t cut = n / 3;
    outside.refresh_compute_params(next.data(), 0, cut);
    outside.refresh_compute_params(next.data() + cut, cut, cut);
    outside.refresh_compute_params(next.data() + cut, cut, n);
    EXPECT_EQ(loss_and_grads(outside), loss_and_grads(own)) << dst::dtype_name(st);
    EXPECT_THROW(outside.refresh_compute_params(next.data(), 0, n + 1), dst::Error);
    EXPECT_THROW(own.refresh_compute_params(next.data(), 0, n), dst::Error);
  }
}
}  // namespace

// Multi-token prediction (model.mtp_depth 1): the module's targets, its parameters in the
// plan's closed form, and the whole objective's gradients against central differences.
namespace {

TEST(MultiTokenPrediction, TargetsAreTheMainTargetsShiftedByOne) {
  // Two samples s of T + 1 = 5 tokens; the main targets are s[1..4], padding ignored.
  const std::int32_t I = dst::model::kIgnoreIndex;
  const std::vector<std::int32_t> targets = {11, 12, 13, 14, 21, 22, I, I};
  std::vector<std::int32_t> tokens(8), mtp(8);
  dst::model::MultiTokenPrediction::make_targets(targets.data(), 2, 4, tokens.data(), mtp.data());
  EXPECT_EQ(tokens, (std::vector<std::int32_t>{11, 12, 13, 14, 21, 22, 0, 0}));
  EXPECT_EQ(mtp, (std::vector<std::int32_t>{12, 13, 14, I, 22, I, I, I}));
}

dst::config::ModelSection small_mtp() {
  auto m = small_gqa();
  m.mtp_depth = 1;
  m.mtp_loss_weight = 0.3;
  return m;
}

TEST(MultiTokenPrediction, LayoutFollowsTheV3CheckpointAndThePlan) {
  auto m = small_mtp();
  for (bool tied : {false, true}) {
    m.tie_embeddings = tied;
    const LanguageModel plan(m, 2, 5, Arena::Mode::plan);
    EXPECT_EQ(plan.params().parameter_count(), dst::model::count_parameters(m).total());
    const auto& ps = plan.params();
    // After the head, V3's names for layer n_layers = 2; no second embedding or head.
    const std::vector<std::string> first = {
        "model.layers.2.enorm.weight", "model.layers.2.hnorm.weight",
        "model.layers.2.eh_proj.weight", "model.layers.2.input_layernorm.weight"};
    const std::size_t at = ps.index_of("model.layers.2.enorm.weight");
    EXPECT_GT(at, ps.index_of("model.norm.weight"));
    for (std::size_t i = 0; i < first.size(); ++i)
      EXPECT_EQ(ps.spec(at + i).name, first[i]);
    EXPECT_EQ(ps.spec(ps.size() - 1).name, "model.layers.2.shared_head.norm.weight");
    EXPECT_EQ(ps.spec(ps.index_of("model.layers.2.eh_proj.weight")).shape,
              (dst::tensor::Shape{8, 16}));
    auto plain = m;
    plain.mtp_depth = 0;
    const auto without = dst::model::count_parameters(plain);
    const auto with = dst::model::count_parameters(m);
    EXPECT_EQ(with.mtp, 3 * 8 + 2 * 8 * 8 + without.per_layer);
    EXPECT_EQ(with.total() - with.mtp, without.total());
    EXPECT_EQ(with.active(), with.total());  // dense: every parameter is active
  }
}

// The objective main mean + lambda x MTP mean: its gradient through the module (eh_proj,
// its norms and block, the shared head's norm) and into the shared embedding, head and the
// main model (through the main head's normalised output), untied and tied, against central
// differences. Same scaling and tolerances as GradientsMatchCentralDifferences. The
// backward reports ready offsets that only decrease, ending at 0.
TEST(MultiTokenPrediction, GradientsMatchCentralDifferences) {
  for (const bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    auto m = small_mtp();
    m.tie_embeddings = tied;
    const std::int64_t B = 2, T = 5;
    LanguageModel model(m, B, T, Arena::Mode::allocate);
    auto& ps = model.params();
    ps.initialize(13);
    spread_parameters(ps);
    const Batch batch = make_batch(B * T, 11, 23);
    const MicroBatchResult first = model.forward(batch.tokens.data(), batch.targets.data());
    const std::int64_t valid = first.valid_tokens;
    const std::int64_t mtp_valid = first.mtp_tokens;
    ASSERT_GT(valid, 0);
    ASSERT_GT(mtp_valid, 0);
    // make_batch ignores targets 1, 5, 9: the MTP targets are the main ones 1-4 of each
    // sequence (positions 0-3), of which 2, 3, 4 and 6, 7, 8 are valid.
    EXPECT_EQ(mtp_valid, 6);
    const double lambda = m.mtp_loss_weight;
    model.set_mtp_loss_scale(lambda * static_cast<double>(valid) / static_cast<double>(mtp_valid));
    ps.zero_grads();
    std::vector<std::size_t> ready;
    model.forward_backward(batch.tokens.data(), batch.targets.data(), 1.0f,
                           [&](std::size_t o) { ready.push_back(o); });
    ASSERT_FALSE(ready.empty());
    for (std::size_t i = 1; i < ready.size(); ++i)
      EXPECT_LE(ready[i], ready[i - 1]) << i;
    EXPECT_EQ(ready.back(), 0u);
    const std::vector<float> grads(ps.grads_data(), ps.grads_data() + ps.buffer_elements());
    auto objective = [&] {
      const MicroBatchResult r = model.forward(batch.tokens.data(), batch.targets.data());
      return r.loss_sum / static_cast<double>(valid) +
             lambda * r.mtp_loss_sum / static_cast<double>(mtp_valid);
    };
    expect_sampled_gradients(ps, grads, valid, 98, objective);
    // Without the module's loss (lambda 0) the main model's gradients are the plain
    // model's: the module reads the main model but adds nothing to its loss.
    model.set_mtp_loss_scale(0.0);
    ps.zero_grads();
    model.forward_backward(batch.tokens.data(), batch.targets.data(), 1.0f);
    auto plain = m;
    plain.mtp_depth = 0;
    LanguageModel base(plain, B, T, Arena::Mode::allocate);
    std::memcpy(base.params().params_data(), ps.params_data(),
                base.params().buffer_elements() * sizeof(float));
    base.params().zero_grads();
    base.forward_backward(batch.tokens.data(), batch.targets.data(), 1.0f);
    for (std::size_t i = 0; i < base.params().size(); ++i) {
      const auto& spec = base.params().spec(i);
      const auto a = base.params().grad(i);
      const auto b = ps.grad(ps.index_of(spec.name));
      for (std::int64_t j = 0; j < a.numel(); ++j)
        ASSERT_NEAR(b.ptr<float>()[j], a.ptr<float>()[j],
                    1e-6f * std::fabs(a.ptr<float>()[j]) + 1e-9f)
            << spec.name << "[" << j << "]";
    }
  }
}

}  // namespace
