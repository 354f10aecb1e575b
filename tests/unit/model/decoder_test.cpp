// The KV-cache decoder against the training model's full-sequence forward, and the
// sampling rules (greedy, temperature, top-k, top-p) of `dstrain generate`.
#include <gtest/gtest.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "config/deck.hpp"
#include "core/error.hpp"
#include "core/rng.hpp"
#include "model/decoder.hpp"
#include "model/language_model.hpp"

namespace {

using dst::model::Decoder;
using dst::model::LanguageModel;
using dst::model::SamplingOptions;
using dst::tensor::Arena;

class KokkosEnvironment : public ::testing::Environment {
 public:
  void SetUp() override { Kokkos::initialize(); }
  void TearDown() override { Kokkos::finalize(); }
};
const auto* const kKokkos = ::testing::AddGlobalTestEnvironment(new KokkosEnvironment);

dst::config::ModelSection tiny(bool gqa, bool tied) {
  dst::config::ModelSection m;
  m.preset = "test";
  m.vocab_size = 37;
  m.d_model = 32;
  m.n_layers = 2;
  m.n_heads = 4;
  m.n_kv_heads = gqa ? 2 : 4;
  m.ffn_dim = 48;
  m.max_seq_len = 16;
  m.rope_theta = 10000.0;
  m.norm_eps = 1e-6;
  m.tie_embeddings = tied;
  return m;
}

/// Weights from the deterministic initialisation, scaled up (std ~0.3 instead of 0.02)
/// so attention is far from uniform and logits spread over several units: with the raw
/// init every logit is ~0 and a wrong position or cache row would hardly show.
void init_params(LanguageModel& model, std::uint64_t seed) {
  auto& ps = model.params();
  ps.initialize(seed);
  for (std::size_t i = 0; i < ps.size(); ++i) {
    if (ps.spec(i).init != dst::model::Init::normal) continue;
    auto t = ps.param(i);
    for (std::int64_t j = 0; j < t.numel(); ++j)
      t.ptr<float>()[j] *= 15.0f;
  }
}

std::vector<std::int32_t> tokens_of(std::int64_t n, std::int64_t vocab, std::uint64_t seed) {
  std::vector<std::int32_t> t;
  for (std::int64_t i = 0; i < n; ++i)
    t.push_back(static_cast<std::int32_t>(
        dst::core::uniform01(seed, 5, static_cast<std::uint64_t>(i)) * static_cast<float>(vocab)));
  return t;
}

/// |ours - ref| <= 1e-5 x max |ref| over the row: both are fp32 with the same kernels;
/// only the attention sums differ in order and length blocking (one head at a time over
/// the cached keys against batched products over the full sequence), each a sum of at
/// most 16 terms per dot product and a few hundred per linear layer, well below 1e-5.
void expect_rows_close(const float* ours, const float* ref, std::int64_t V, const char* what,
                       std::int64_t pos) {
  float scale = 0.0f;
  for (std::int64_t j = 0; j < V; ++j)
    scale = std::max(scale, std::fabs(ref[j]));
  ASSERT_GT(scale, 0.5f) << "logits too small to compare meaningfully";
  for (std::int64_t j = 0; j < V; ++j)
    ASSERT_NEAR(ours[j], ref[j], 1e-5f * scale) << what << ": position " << pos << " token " << j;
}

class DecoderParity : public ::testing::TestWithParam<std::pair<bool, bool>> {};

TEST_P(DecoderParity, CachedLogitsEqualFullSequenceForwardAtEveryPosition) {
  const auto [gqa, tied] = GetParam();
  const auto m = tiny(gqa, tied);
  const std::int64_t T = 12, V = m.vocab_size;
  LanguageModel model(m, 1, T, Arena::Mode::allocate);
  init_params(model, 11);
  const auto tok = tokens_of(T, V, 3);
  model.forward(tok.data(), tok.data());
  const float* ref = model.logits().ptr<float>();  // (T, V)

  Decoder dec(m, model.params(), m.max_seq_len);
  EXPECT_EQ(dec.cache_values(), Decoder::cache_values_per_token(m));
  // The whole sequence at once (prefill), all positions.
  auto all = dec.append(tok.data(), T, true);
  ASSERT_EQ(all.shape[0], T);
  for (std::int64_t t = 0; t < T; ++t)
    expect_rows_close(all.ptr<float>() + t * V, ref + t * V, V, "prefill", t);
  EXPECT_EQ(dec.position(), T);

  // A 5-token prompt, then one token at a time through the cache.
  dec.reset();
  auto pre = dec.append(tok.data(), 5, true);
  for (std::int64_t t = 0; t < 5; ++t)
    expect_rows_close(pre.ptr<float>() + t * V, ref + t * V, V, "prompt", t);
  for (std::int64_t t = 5; t < T; ++t) {
    auto one = dec.append(&tok[static_cast<std::size_t>(t)], 1);
    ASSERT_EQ(one.shape[0], 1);
    expect_rows_close(one.ptr<float>(), ref + t * V, V, "cached step", t);
  }
  // Without all_logits a prefill returns the last row only.
  dec.reset();
  auto last = dec.append(tok.data(), T);
  ASSERT_EQ(last.shape[0], 1);
  expect_rows_close(last.ptr<float>(), ref + (T - 1) * V, V, "last row", T - 1);
}

// A model with a multi-token prediction module (model.mtp_depth 1): the decoder takes its
// whole parameter store (the module's tensors included) and runs the main model only,
// whose logits it reproduces; the module's own logits (token t+2) are another thing.
TEST(Decoder, SkipsTheMultiTokenPredictionModule) {
  auto m = tiny(true, false);
  m.mtp_depth = 1;
  const std::int64_t T = 12, V = m.vocab_size;
  LanguageModel model(m, 1, T, Arena::Mode::allocate);
  init_params(model, 17);
  const auto tok = tokens_of(T, V, 4);
  model.forward(tok.data(), tok.data());
  const float* ref = model.logits().ptr<float>();
  Decoder dec(m, model.params(), m.max_seq_len);
  auto all = dec.append(tok.data(), T, true);
  for (std::int64_t t = 0; t < T; ++t)
    expect_rows_close(all.ptr<float>() + t * V, ref + t * V, V, "prefill with MTP", t);
  const float* mtp = model.mtp_logits().ptr<float>();
  float differs = 0.0f;
  for (std::int64_t j = 0; j < T * V; ++j)
    differs = std::max(differs, std::fabs(mtp[j] - ref[j]));
  EXPECT_GT(differs, 0.1f);
}

INSTANTIATE_TEST_SUITE_P(Shapes, DecoderParity,
                         ::testing::Values(std::make_pair(false, false),
                                           std::make_pair(true, false),
                                           std::make_pair(true, true)));

/// DeepSeek-V2/V3 shapes: latent attention (with and without a query latent, with and
/// without q_nope columns), and DeepSeekMoE blocks after a dense one.
dst::config::ModelSection latent(std::int64_t q_lora, std::int64_t nope, bool moe) {
  auto m = tiny(false, false);
  m.n_layers = 3;
  m.kv_lora_rank = 12;
  m.q_lora_rank = q_lora;
  m.qk_nope_head_dim = nope;
  m.qk_rope_head_dim = 6;
  m.v_head_dim = 5;
  if (moe) {
    m.n_routed_experts = 6;
    m.n_shared_experts = 1;
    m.num_experts_per_tok = 2;
    m.moe_intermediate_size = 10;
    m.first_k_dense_replace = 1;
    m.n_group = 1;
    m.topk_group = 1;
  }
  return m;
}

struct LatentCase {
  std::int64_t q_lora, nope;
  bool moe;
};

class LatentDecoderParity : public ::testing::TestWithParam<LatentCase> {};

// The latent cache's absorbed products ((q_nope W_UK) c^T and (p c) W_UV^T) against the
// training forward's expanded keys and values (q_nope (c W_UK^T)^T, p (c W_UV^T)): the same
// sums in another association, each over at most kv_lora x 16 terms, within the same 1e-5.
TEST_P(LatentDecoderParity, CachedLogitsEqualFullSequenceForwardAtEveryPosition) {
  const LatentCase k = GetParam();
  const auto m = latent(k.q_lora, k.nope, k.moe);
  const std::int64_t T = 12, V = m.vocab_size;
  LanguageModel model(m, 1, T, Arena::Mode::allocate);
  init_params(model, 21);
  const auto tok = tokens_of(T, V, 4);
  model.forward(tok.data(), tok.data());
  const float* ref = model.logits().ptr<float>();

  Decoder dec(m, model.params(), m.max_seq_len);
  EXPECT_EQ(dec.cache_values(), m.kv_lora_rank + m.qk_rope_head_dim);
  EXPECT_EQ(dec.cache_values(), Decoder::cache_values_per_token(m));
  auto all = dec.append(tok.data(), T, true);
  for (std::int64_t t = 0; t < T; ++t)
    expect_rows_close(all.ptr<float>() + t * V, ref + t * V, V, "prefill", t);
  dec.reset();
  auto pre = dec.append(tok.data(), 4, true);
  for (std::int64_t t = 0; t < 4; ++t)
    expect_rows_close(pre.ptr<float>() + t * V, ref + t * V, V, "prompt", t);
  for (std::int64_t t = 4; t < T; ++t) {
    auto one = dec.append(&tok[static_cast<std::size_t>(t)], 1);
    expect_rows_close(one.ptr<float>(), ref + t * V, V, "cached step", t);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, LatentDecoderParity,
                         ::testing::Values(LatentCase{0, 8, false}, LatentCase{10, 8, false},
                                           LatentCase{10, 0, false}, LatentCase{0, 8, true}),
                         [](const ::testing::TestParamInfo<LatentCase>& i) {
                           const LatentCase& c = i.param;
                           return std::string(c.q_lora > 0 ? "QueryLatent" : "FullQuery") +
                                  (c.nope > 0 ? "" : "NoNope") + (c.moe ? "Moe" : "Dense");
                         });

// What one token costs in the cache per layer: DeepSeek-V3 caches its 512-wide latent and
// 64-wide RoPE key (576 floats; DeepSeek-V2 section 2.1.2), not 2 x 128 heads x 128/192.
TEST(Decoder, LatentCacheHoldsTheCompressedLatentPerToken) {
  EXPECT_EQ(Decoder::cache_values_per_token(dst::config::preset_model("deepseek-v3")), 576);
  EXPECT_EQ(Decoder::cache_values_per_token(dst::config::preset_model("deepseek-v2-lite")), 576);
  EXPECT_EQ(Decoder::cache_values_per_token(dst::config::preset_model("tiny-moe")), 96);
  EXPECT_EQ(Decoder::cache_values_per_token(dst::config::preset_model("deepseek-llm-67b")),
            2 * 8 * 128);
}

TEST(Decoder, RefusesOverflowBadTokensAndMismatchedStores) {
  const auto m = tiny(true, false);
  LanguageModel model(m, 1, 4, Arena::Mode::allocate);
  init_params(model, 1);
  Decoder dec(m, model.params(), 6);
  const auto tok = tokens_of(6, m.vocab_size, 1);
  dec.append(tok.data(), 6);
  EXPECT_THROW(dec.append(tok.data(), 1), dst::Error);  // past max_len
  dec.reset();
  const std::int32_t bad = static_cast<std::int32_t>(m.vocab_size);
  EXPECT_THROW(dec.append(&bad, 1), dst::Error);
  EXPECT_THROW(Decoder(m, model.params(), m.max_seq_len + 1), dst::Error);
  auto other = m;
  other.ffn_dim = 40;
  EXPECT_THROW(Decoder(other, model.params(), 4), dst::Error);
}

/// Greedy generation from a prompt: the argmax is fed back each step.
std::vector<std::int32_t> generate(Decoder& dec, const std::vector<std::int32_t>& prompt, int n,
                                   const SamplingOptions& o) {
  dec.reset();
  std::vector<std::int32_t> out;
  auto logits = dec.append(prompt.data(), static_cast<std::int64_t>(prompt.size()));
  for (int i = 0; i < n; ++i) {
    const std::int32_t t = dst::model::sample_token(logits.ptr<float>(), dec.vocab_size(), o,
                                                    static_cast<std::uint64_t>(i));
    out.push_back(t);
    if (i + 1 < n) logits = dec.append(&t, 1);
  }
  return out;
}

TEST(Decoder, GenerationIsDeterministicAndSeeded) {
  const auto m = tiny(true, false);
  LanguageModel model(m, 1, 4, Arena::Mode::allocate);
  init_params(model, 5);
  Decoder dec(m, model.params(), m.max_seq_len);
  const auto prompt = tokens_of(4, m.vocab_size, 9);
  SamplingOptions greedy;
  const auto a = generate(dec, prompt, 10, greedy);
  EXPECT_EQ(a, generate(dec, prompt, 10, greedy));
  SamplingOptions hot;
  hot.temperature = 2.0;  // flat enough that two seeds differ somewhere in 10 draws
  hot.seed = 1;
  const auto s1 = generate(dec, prompt, 10, hot);
  EXPECT_EQ(s1, generate(dec, prompt, 10, hot));
  hot.seed = 2;
  EXPECT_NE(s1, generate(dec, prompt, 10, hot));
  // top-k 1 and a vanishing top-p sample the greedy sequence whatever the seed.
  SamplingOptions k1 = hot;
  k1.top_k = 1;
  EXPECT_EQ(generate(dec, prompt, 10, k1), a);
  SamplingOptions p0 = hot;
  p0.top_p = 1e-9;
  EXPECT_EQ(generate(dec, prompt, 10, p0), a);
}

TEST(Sampling, GreedyIsTheArgmaxLowestIdOnTies) {
  const std::vector<float> l{0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
  SamplingOptions o;
  EXPECT_EQ(dst::model::sample_token(l.data(), 5, o, 0), 1);
  const auto d = dst::model::sampling_distribution(l.data(), 5, o);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].first, 1);
  EXPECT_EQ(d[0].second, 1.0);
}

TEST(Sampling, TemperatureScalesTheSoftmax) {
  const std::vector<float> l{1.0f, 3.0f, 0.0f, 2.0f};
  for (double temp : {0.5, 1.0, 3.0}) {
    SamplingOptions o;
    o.temperature = temp;
    const auto d = dst::model::sampling_distribution(l.data(), 4, o);
    ASSERT_EQ(d.size(), 4u);
    double z = 0.0;
    for (float x : l)
      z += std::exp(x / temp);
    // Most likely first: ids 1, 3, 0, 2.
    const std::int32_t order[] = {1, 3, 0, 2};
    for (std::size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(d[i].first, order[i]);
      // Double arithmetic on both sides: only rounding differs.
      EXPECT_NEAR(d[i].second, std::exp(l[static_cast<std::size_t>(order[i])] / temp) / z, 1e-12);
    }
  }
}

TEST(Sampling, TopKAndTopPKeepTheMostLikelyRenormalised) {
  // Probabilities at T = 1: proportional to e^x; ids by likelihood 1, 3, 0, 2.
  const std::vector<float> l{1.0f, 3.0f, 0.0f, 2.0f};
  SamplingOptions o;
  o.temperature = 1.0;
  o.top_k = 2;
  auto d = dst::model::sampling_distribution(l.data(), 4, o);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].first, 1);
  EXPECT_EQ(d[1].first, 3);
  EXPECT_NEAR(d[0].second, std::exp(3.0) / (std::exp(3.0) + std::exp(2.0)), 1e-12);
  EXPECT_NEAR(d[0].second + d[1].second, 1.0, 1e-12);
  o.top_k = 1;
  d = dst::model::sampling_distribution(l.data(), 4, o);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].first, 1);
  o.top_k = 10;  // more than the vocabulary: all kept
  EXPECT_EQ(dst::model::sampling_distribution(l.data(), 4, o).size(), 4u);
  // top-p: p(1) = 0.644, p(3) = 0.237, p(0) = 0.087, p(2) = 0.032.
  o.top_k = 0;
  o.top_p = 0.6;  // the first token alone holds 0.644 >= 0.6
  d = dst::model::sampling_distribution(l.data(), 4, o);
  ASSERT_EQ(d.size(), 1u);
  o.top_p = 0.7;  // needs the second
  d = dst::model::sampling_distribution(l.data(), 4, o);
  ASSERT_EQ(d.size(), 2u);
  o.top_p = 0.9;  // 0.881 < 0.9: needs the third
  d = dst::model::sampling_distribution(l.data(), 4, o);
  ASSERT_EQ(d.size(), 3u);
  o.top_p = 1e-12;  // p -> 0: the argmax alone
  d = dst::model::sampling_distribution(l.data(), 4, o);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].first, 1);
  // top-k first, then top-p over the kept mass: of {1, 3} (0.731, 0.269), 0.7 needs 1.
  o.top_k = 2;
  o.top_p = 0.7;
  d = dst::model::sampling_distribution(l.data(), 4, o);
  ASSERT_EQ(d.size(), 1u);
  for (std::uint64_t i = 0; i < 50; ++i)
    EXPECT_EQ(dst::model::sample_token(l.data(), 4, o, i), 1);
}

TEST(Sampling, DrawsFollowTheDistribution) {
  // 4000 draws of p = (0.644, 0.237, 0.087, 0.032): each frequency within 4 standard
  // deviations (sqrt(p (1 - p) / n) <= 0.008) of its probability.
  const std::vector<float> l{1.0f, 3.0f, 0.0f, 2.0f};
  SamplingOptions o;
  o.temperature = 1.0;
  o.seed = 77;
  const auto d = dst::model::sampling_distribution(l.data(), 4, o);
  std::vector<int> count(4, 0);
  const int n = 4000;
  for (int i = 0; i < n; ++i)
    ++count[static_cast<std::size_t>(
        dst::model::sample_token(l.data(), 4, o, static_cast<std::uint64_t>(i)))];
  for (const auto& [id, p] : d)
    EXPECT_NEAR(count[static_cast<std::size_t>(id)] / static_cast<double>(n), p, 0.032) << id;
}

TEST(Sampling, RefusesBadOptions) {
  const std::vector<float> l{1.0f, 2.0f};
  SamplingOptions o;
  o.temperature = -1.0;
  EXPECT_THROW(dst::model::sample_token(l.data(), 2, o, 0), dst::Error);
  o = {};
  o.top_k = -1;
  EXPECT_THROW(dst::model::validate(o), dst::Error);
  o = {};
  o.top_p = 0.0;
  EXPECT_THROW(dst::model::validate(o), dst::Error);
  o.top_p = 1.5;
  EXPECT_THROW(dst::model::validate(o), dst::Error);
}

}  // namespace
