// Closed-form parameter and FLOP counts of the DeepSeek-LLM decoder against published sizes
// (model/plan.hpp); the memory and communication plan is train's (tests/unit/train).
#include <gtest/gtest.h>

#include <algorithm>

#include "config/deck.hpp"
#include "core/error.hpp"
#include "model/language_model.hpp"
#include "model/pipeline_schedule.hpp"
#include "model/plan.hpp"

namespace {

dst::config::ModelSection deepseek_llm_7b() {
  dst::config::ModelSection m;
  m.preset = "deepseek-llm-7b";
  m.vocab_size = 102400;
  m.d_model = 4096;
  m.n_layers = 30;
  m.n_heads = 32;
  m.n_kv_heads = 32;
  m.ffn_dim = 11008;
  m.max_seq_len = 4096;
  return m;
}

dst::config::ModelSection deepseek_llm_67b() {
  dst::config::ModelSection m = deepseek_llm_7b();
  m.preset = "deepseek-llm-67b";
  m.d_model = 8192;
  m.n_layers = 95;
  m.n_heads = 64;
  m.n_kv_heads = 8;
  m.ffn_dim = 22016;
  return m;
}

// Parameter counts by hand from the published shapes (deepseek-ai/deepseek-llm-*-base
// config.json): V*C embedding and head, per layer 2*C*C (q, o) + 2*C*kv (k, v) +
// 3*C*F (SwiGLU) + 2*C (norms), plus the final norm.
TEST(Plan, DeepSeekLlm7bParameterCount) {
  const auto p = dst::model::count_parameters(deepseek_llm_7b());
  EXPECT_EQ(p.embedding, 419430400);
  EXPECT_EQ(p.per_layer, 202383360);
  EXPECT_EQ(p.total(), 6910365696);  // "7B": 6.91 B
}

TEST(Plan, DeepSeekLlm67bParameterCountWithGroupedQueryAttention) {
  const auto p = dst::model::count_parameters(deepseek_llm_67b());
  // k and v are 8 heads x 128 = 1024 wide.
  EXPECT_EQ(p.per_layer, 2LL * 8192 * 8192 + 2LL * 8192 * 1024 + 3LL * 8192 * 22016 + 2 * 8192);
  EXPECT_EQ(p.total(), 67425001472);  // "67B"
}

// deepseek-1b (V 102400, C 2048, L 24, F 5504, 16 heads = 16 kv heads) by hand:
//   embedding V*C                      = 102400 * 2048        =   209,715,200
//   head      V*C                      =                          209,715,200
//   per layer 4*C*C + 3*C*F + 2*C      = 16,777,216 + 33,816,576 + 4,096
//                                      =    50,597,888; x 24  = 1,214,349,312
//   final norm C                       =                                2,048
//   total                                                     = 1,633,781,760
TEST(Plan, DeepSeek1bPresetParameterCount) {
  const auto m = dst::config::preset_model("deepseek-1b");
  const auto p = dst::model::count_parameters(m);
  EXPECT_EQ(p.embedding, 209715200);
  EXPECT_EQ(p.head, 209715200);
  EXPECT_EQ(p.per_layer, 50597888);
  EXPECT_EQ(p.layers, 1214349312);
  EXPECT_EQ(p.final_norm, 2048);
  EXPECT_EQ(p.total(), 1633781760);  // "1.6e9"
  // 6 x (total - embedding) + 12 L T C at T = 2048: the figure the throughput check's MFU
  // uses (benchmarks/gpu/throughput).
  EXPECT_DOUBLE_EQ(dst::model::training_flops_per_token(m, 2048),
                   6.0 * (1633781760.0 - 209715200.0) + 12.0 * 24 * 2048 * 2048);
}

TEST(Plan, TiedEmbeddingsDropTheHead) {
  auto m = deepseek_llm_7b();
  m.tie_embeddings = true;
  EXPECT_EQ(dst::model::count_parameters(m).total(), 6910365696 - 419430400);
}

TEST(Plan, FlopsPerTokenIsSixNPlusAttention) {
  const auto m = deepseek_llm_7b();
  const double f = dst::model::training_flops_per_token(m, 4096);
  // 6 x (non-embedding parameters, head included) + 12 L T C.
  EXPECT_DOUBLE_EQ(f, 6 * (6910365696.0 - 419430400.0) + 12.0 * 30 * 4096 * 4096);
  auto tied = m;
  tied.tie_embeddings = true;  // the head matmul still runs: same FLOPs
  EXPECT_DOUBLE_EQ(dst::model::training_flops_per_token(tied, 4096), f);
}

// A multi-token prediction module: its parameters (3 norms, eh_proj (C, 2C), one block),
// the shared head's second product and one more block of attention; recompute's full
// forward again covers its block.
TEST(Plan, MultiTokenPredictionCountsItsBlockHeadAndAttention) {
  auto m = deepseek_llm_7b();
  const double C = 4096, V = 102400, T = 4096;
  const auto plain = dst::model::count_parameters(m);
  m.mtp_depth = 1;
  const auto with = dst::model::count_parameters(m);
  EXPECT_EQ(with.mtp, static_cast<std::int64_t>(3 * C + 2 * C * C) + plain.per_layer);
  EXPECT_EQ(with.total(), plain.total() + with.mtp);
  auto none = m;
  none.mtp_depth = 0;
  EXPECT_DOUBLE_EQ(dst::model::training_flops_per_token(m, 4096),
                   dst::model::training_flops_per_token(none, 4096) +
                       6.0 * (static_cast<double>(with.mtp) + V * C) + 12.0 * T * C);
  EXPECT_DOUBLE_EQ(dst::model::recompute_flops_per_token(m, 4096, dst::config::Recompute::full),
                   dst::model::recompute_flops_per_token(none, 4096, dst::config::Recompute::full) +
                       2.0 * static_cast<double>(plain.per_layer) + 4.0 * T * C);
}

TEST(Plan, Formatting) {
  EXPECT_EQ(dst::model::format_bytes(512), "512 B");
  EXPECT_EQ(dst::model::format_bytes(1.5 * 1024 * 1024 * 1024), "1.50 GiB");
  EXPECT_EQ(dst::model::format_count(6910365696.0), "6.91 B");
}

}  // namespace
