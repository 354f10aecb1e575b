// Run deck: parsing, validation messages, overrides, presets, layout, YAML round trip,
// schema-generated docs.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "config/deck.hpp"
#include "config/run_config.hpp"
#include "core/error.hpp"

namespace {

using dst::DeckError;
using dst::config::Layout;
using dst::config::load_deck_text;
using dst::config::Override;
using dst::config::parse_override;
using dst::config::RunConfig;

std::vector<Override> overrides_of(const std::vector<std::string>& sets) {
  std::vector<Override> out;
  for (const std::string& s : sets)
    out.push_back(parse_override(s));
  return out;
}

RunConfig load(std::string_view text, const std::vector<std::string>& sets = {}) {
  return load_deck_text(text, "deck.yaml", overrides_of(sets));
}

// The message of the DeckError loading throws, or a marker that fails every substring
// check.
std::string load_error(std::string_view text, const std::vector<std::string>& sets = {}) {
  try {
    load(text, sets);
  } catch (const DeckError& e) {
    return e.what();
  }
  return "<no error>";
}

::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

::testing::AssertionResult Lacks(const std::string& text, const std::string& part) {
  if (text.find(part) == std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' contains '" << part << "'";
}

// The example deck of the design notes (DECK.md), without grad_accum_steps: giving it
// together with global_batch_size is an error.
constexpr const char* kExampleDeck = R"(run:
  name: tiny-demo
  seed: 1234
  output_dir: runs/tiny-demo

model:
  preset: tiny
  vocab_size: 260
  d_model: 256
  n_layers: 4
  n_heads: 4
  n_kv_heads: 4
  ffn_dim: 688
  max_seq_len: 256
  rope_theta: 10000.0
  norm_eps: 1.0e-6
  tie_embeddings: false

data:
  train: data/train-*.h5
  valid: data/valid.h5
  seq_len: 256

training:
  max_steps: 200
  global_batch_size: 16      # sequences per optimizer step
  micro_batch_size: 8
  precision: fp32
  grad_clip: 1.0
  optimizer: {type: adamw, lr: 3.0e-4, betas: [0.9, 0.95], eps: 1.0e-8, weight_decay: 0.1}
  schedule:  {type: cosine, warmup_steps: 20, min_lr_ratio: 0.1, world_size_scaling: none, reference_world_size: 1}

parallel:
  data: auto
  tensor: 1
  pipeline: 1
  backend: auto
  bucket_mb: 25
  timeout_s: 600
  init_timeout_s: 300

kernels:
  backend: auto

checkpoint:
  every_steps: 100
  keep_last: 3
  resume: auto

logging:
  every_steps: 10
  metrics_file: metrics.jsonl

eval:
  every_steps: 100
  batches: 10

debug:
  deterministic: true
  consistency_every: 100
  nan_policy: abort
  inject_nan_step: -1
  inject_hang_rank: -1
  inject_exit_rank: -1
  inject_exit_in_checkpoint: false
  inject_read_delay_ms: 0
)";

// ---------------------------------------------------------------------------------------
// Parsing and defaults
// ---------------------------------------------------------------------------------------

TEST(Deck, ExampleDeckLoads) {
  const RunConfig c = load(kExampleDeck);
  EXPECT_EQ(c.run.name, "tiny-demo");
  EXPECT_EQ(c.run.output_dir, "runs/tiny-demo");
  EXPECT_EQ(c.data.train, "data/train-*.h5");
  EXPECT_EQ(c.training.optimizer.lr, 3.0e-4);  // exact: parsed from the same decimal text
  EXPECT_EQ(c.training.optimizer.betas[1], 0.95);
  EXPECT_EQ(c.parallel.data, 0);
  EXPECT_EQ(c.parallel.bucket_mb, 25.0);
  RunConfig expected;
  expected.run.name = "tiny-demo";
  expected.run.output_dir = "runs/tiny-demo";
  expected.data.train = "data/train-*.h5";
  expected.data.valid = "data/valid.h5";
  EXPECT_EQ(c, expected);
}

TEST(Deck, MinimalDeckGivesDefaults) {
  EXPECT_EQ(load("run: {}\n"), RunConfig{});
  EXPECT_EQ(load("training:\n"), RunConfig{});  // an empty section is allowed
}

TEST(Deck, ScalarsFollowYamlCoreSchema) {
  const RunConfig c = load(
      "run: {name: 2024, seed: 0x10}\n"
      "debug: {deterministic: False, inject_nan_step: +7}\n"
      "training: {max_steps: 030, optimizer: {lr: 1}}\n");
  EXPECT_EQ(c.run.name, "2024");  // a number where a string is expected keeps its text
  EXPECT_EQ(c.run.seed, 16u);
  EXPECT_FALSE(c.debug.deterministic);
  EXPECT_EQ(c.debug.inject_nan_step, 7);
  EXPECT_EQ(c.training.max_steps, 30);  // YAML 1.2: decimal, not octal
  EXPECT_EQ(c.training.optimizer.lr, 1.0);
}

// ---------------------------------------------------------------------------------------
// Error classes
// ---------------------------------------------------------------------------------------

TEST(DeckErrors, SyntaxErrorHasLocation) {
  EXPECT_EQ(load_error("run:\n  name: x\ntraining: {max_steps: 10\n"),
            "deck.yaml:3:11: unclosed '{' (a flow collection must be closed)");
  const std::string e = load_error("run:\n  name: x\ntraining: {max_steps: 10]\n");
  EXPECT_TRUE(Contains(e, "deck.yaml:3:"));
  EXPECT_TRUE(Contains(e, "YAML syntax error"));
  const std::string e2 = load_error("run:\n  name: a: b\n");
  EXPECT_TRUE(Contains(e2, "deck.yaml:2:")) << e2;
  EXPECT_TRUE(Contains(e2, "YAML syntax error"));
}

TEST(DeckErrors, UnknownKeyWithSuggestion) {
  EXPECT_EQ(load_error("training:\n  max_steps: 10\n  max_stpes: 10\n"),
            "deck.yaml:3:3: training.max_stpes: unknown key (did you mean 'training.max_steps'?)");
  EXPECT_TRUE(Contains(load_error("model:\n  n_head: 4\n"), "did you mean 'model.n_heads'?"));
  // A key of the same name in another section is suggested too.
  EXPECT_TRUE(
      Contains(load_error("training:\n  lr: 0.1\n"), "did you mean 'training.optimizer.lr'?"));
}

TEST(DeckErrors, UnknownSection) {
  EXPECT_EQ(load_error("trainig:\n  max_steps: 10\n"),
            "deck.yaml:1:1: trainig: unknown key (did you mean 'training'?)");
  const std::string e = load_error("run: {}\nbogus_section:\n  x: 1\n");
  EXPECT_EQ(e, "deck.yaml:2:1: bogus_section: unknown key");
}

TEST(DeckErrors, UnknownNestedKeyWithoutCloseMatch) {
  const std::string e = load_error("training:\n  optimizer:\n    foo: 1\n");
  EXPECT_TRUE(Contains(e, "deck.yaml:3:5: training.optimizer.foo: unknown key"));
  EXPECT_TRUE(Lacks(e, "did you mean"));
}

TEST(DeckErrors, DottedKeyIsNotExpanded) {
  const std::string e = load_error("training.max_steps: 10\n");
  EXPECT_TRUE(Contains(e, "deck.yaml:1:1: training.max_steps: unknown key"));
  EXPECT_TRUE(Contains(e, "nest them"));
}

TEST(DeckErrors, WrongTypes) {
  struct Case {
    const char* deck;
    const char* message;
  };
  const Case cases[] = {
      {"training:\n  max_steps: abc\n",
       "deck.yaml:2:14: training.max_steps: expected an integer, got 'abc'"},
      {"training:\n  max_steps: {a: 1}\n",
       "deck.yaml:2:14: training.max_steps: expected an integer, got a mapping"},
      {"training:\n  max_steps: [1]\n",
       "deck.yaml:2:14: training.max_steps: expected an integer, got a list"},
      {"training:\n  max_steps: 1.5\n",
       "deck.yaml:2:14: training.max_steps: expected an integer, got 1.5 (a number with a "
       "fraction or exponent)"},
      {"training:\n  max_steps: 1e3\n", "training.max_steps: expected an integer, got 1e3"},
      {"training:\n  max_steps: \"10\"\n",
       "training.max_steps: expected an integer, got the quoted string '10'"},
      {"training:\n  max_steps:\n", "training.max_steps: expected an integer, got null"},
      {"training:\n  max_steps: 99999999999999999999\n",
       "training.max_steps: integer '99999999999999999999' is out of range"},
      {"debug:\n  deterministic: yes\n",
       "deck.yaml:2:18: debug.deterministic: expected a boolean (true or false), got 'yes'"},
      {"debug:\n  deterministic: no\n", "expected a boolean (true or false), got 'no'"},
      {"debug:\n  deterministic: 1\n", "expected a boolean (true or false), got '1'"},
      {"training:\n  optimizer:\n    lr: fast\n",
       "deck.yaml:3:9: training.optimizer.lr: expected a number, got 'fast'"},
      {"training:\n  optimizer:\n    lr: .nan\n",
       "training.optimizer.lr: must be a finite number, got .nan"},
      {"training:\n  optimizer:\n    lr: -.inf\n",
       "training.optimizer.lr: must be a finite number"},
      {"training:\n  optimizer:\n    lr: 1e999\n",
       "training.optimizer.lr: number '1e999' is out of range"},
      {"training:\n  optimizer:\n    betas: 0.9\n",
       "training.optimizer.betas: expected a list of 2 numbers, got '0.9'"},
      {"training:\n  optimizer:\n    betas: [0.9, 0.95, 0.99]\n",
       "training.optimizer.betas: expected a list of 2 numbers, got 3 of them"},
      {"training:\n  optimizer:\n    betas: [0.9, x]\n",
       "training.optimizer.betas[1]: expected a number, got 'x'"},
      {"run:\n  name: {a: 1}\n", "deck.yaml:2:9: run.name: expected a string, got a mapping"},
      {"training: 5\n", "deck.yaml:1:11: training: expected a section (a mapping), got '5'"},
      {"model:\n  - a\n", "model: expected a section (a mapping), got a list"},
      {"run:\n  seed: -1\n", "deck.yaml:2:9: run.seed: must be >= 0, got -1"},
      {"parallel:\n  data: many\n", "parallel.data: expected an integer or auto, got 'many'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.deck);
    EXPECT_TRUE(Contains(load_error(c.deck), c.message));
  }
}

TEST(DeckErrors, OutOfRange) {
  struct Case {
    const char* deck;
    const char* message;
  };
  const Case cases[] = {
      {"training:\n  max_steps: -5\n", "deck.yaml:2:14: training.max_steps: must be >= 1, got -5"},
      {"training:\n  optimizer:\n    lr: 0\n", "training.optimizer.lr: must be > 0, got 0"},
      {"training:\n  optimizer:\n    lr: -1e-3\n",
       "training.optimizer.lr: must be > 0, got -0.001"},
      {"training:\n  optimizer:\n    betas: [0.9, 1.0]\n",
       "training.optimizer.betas: training.optimizer.betas[1] must be in [0, 1), got 1"},
      {"training:\n  optimizer:\n    betas: [-0.1, 0.9]\n",
       "training.optimizer.betas[0] must be in [0, 1), got -0.1"},
      {"training:\n  schedule:\n    min_lr_ratio: 1.5\n",
       "training.schedule.min_lr_ratio: must be in [0, 1], got 1.5"},
      {"training:\n  schedule:\n    milestones: [0.5, 1.0]\n    factors: [0.5, 0.1]\n",
       "training.schedule.milestones[1] must be in (0, 1), got 1"},
      {"training:\n  schedule:\n    milestones: [0.6, 0.5]\n    factors: [0.5, 0.1]\n",
       "training.schedule.milestones: must be strictly increasing, got 0.6 then 0.5"},
      {"training:\n  schedule:\n    factors: [0.5, 0]\n",
       "training.schedule.factors[1] must be > 0, got 0"},
      {"parallel:\n  timeout_s: 0\n", "parallel.timeout_s: must be in (0, 1000000], got 0"},
      {"parallel:\n  init_timeout_s: -3\n", "parallel.init_timeout_s: must be in (0, 1000000]"},
      {"parallel:\n  bucket_mb: 0\n", "parallel.bucket_mb: must be > 0, got 0"},
      {"parallel:\n  tensor: 0\n", "parallel.tensor: must be in [1, 2147483647], got 0"},
      {"parallel:\n  data: -2\n", "parallel.data: must be in [1, 2147483647] or auto, got -2"},
      {"model:\n  vocab_size: 0\n", "deck.yaml:2:15: model.vocab_size: must be in [1, 2147483647]"},
      {"model:\n  norm_eps: 0\n", "model.norm_eps: must be > 0"},
      {"training:\n  micro_batch_size: 0\n", "training.micro_batch_size: must be in [1, "},
      {"training:\n  global_batch_size: -16\n", "training.global_batch_size: must be >= 0"},
      {"training:\n  grad_clip: -1\n", "training.grad_clip: must be >= 0"},
      {"checkpoint:\n  keep_last: 0\n", "checkpoint.keep_last: must be >= 1"},
      {"checkpoint:\n  resume: ''\n", "checkpoint.resume: must not be empty"},
      {"debug:\n  inject_nan_step: -2\n", "debug.inject_nan_step: must be >= -1, got -2"},
      {"run:\n  output_dir: \"\"\n", "run.output_dir: must not be empty"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.deck);
    EXPECT_TRUE(Contains(load_error(c.deck), c.message));
  }
}

TEST(DeckErrors, EnumValuesListAllowed) {
  EXPECT_EQ(load_error("training:\n  precision: fp8\n"),
            "deck.yaml:2:14: training.precision: expected one of fp32, bf16, fp16, got 'fp8'");
  EXPECT_TRUE(Contains(load_error("training:\n  schedule: {type: step}\n"),
                       "expected one of constant, cosine, linear, inverse_sqrt, multistep"));
  EXPECT_TRUE(Contains(load_error("parallel:\n  backend: gloo\n"),
                       "parallel.backend: expected one of auto, mpi, shm, nccl, got 'gloo'"));
  EXPECT_TRUE(Contains(load_error("kernels:\n  backend: hip\n"), "auto, kokkos, cuda"));
  EXPECT_TRUE(Contains(load_error("kernels:\n  host_gemm: mkl\n"), "auto, blas, dstrain"));
  EXPECT_TRUE(Contains(load_error("debug:\n  nan_policy: ignore\n"), "abort, skip"));
  EXPECT_TRUE(Contains(load_error("training:\n  optimizer: {type: sgd}\n"), "one of adamw"));
  EXPECT_TRUE(Contains(load_error("training:\n  schedule: {world_size_scaling: log}\n"),
                       "none, linear, sqrt"));
  EXPECT_TRUE(Contains(load_error("training:\n  precision:\n"), "got null"));
}

// Expert parallelism (parallel.expert): an MoE model whose routed experts it divides, not
// with NCCL; the data ranks it divides (resolve_layout, at the world size).
TEST(DeckErrors, ExpertParallelism) {
  EXPECT_EQ(load_error("parallel:\n  expert: 2\n"),
            "deck.yaml:2:11: parallel.expert: parallel.expert 2 needs a DeepSeekMoE model "
            "(model.n_routed_experts > 0)");
  EXPECT_EQ(load_error("model: {preset: tiny-moe}\n", {"parallel.expert=3"}),
            "--set parallel.expert=3: parallel.expert: parallel.expert (3) does not divide "
            "model.n_routed_experts (8): each rank of an expert group holds the same number of "
            "experts");
  EXPECT_TRUE(
      Contains(load_error("model: {preset: tiny-moe}\nparallel: {expert: 2, backend: nccl}\n"),
               "parallel.expert: parallel.expert 2 is not supported with parallel.backend "
               "nccl"));
  EXPECT_TRUE(Contains(load_error("parallel:\n  expert: 0\n"), "parallel.expert"));
  const RunConfig c = load(
      "model: {preset: tiny-moe}\nparallel: {expert: 4}\n"
      "training: {global_batch_size: 16, micro_batch_size: 2}\n");
  EXPECT_EQ(c.parallel.expert, 4);
  const dst::config::Layout four = dst::config::resolve_layout(c, 4);
  EXPECT_EQ(four.expert, 4);
  EXPECT_EQ(dst::config::resolve_layout(c, 8).expert, 4);
  try {
    dst::config::resolve_layout(c, 2);
    ADD_FAILURE() << "no error";
  } catch (const DeckError& e) {
    EXPECT_EQ(e.key(), "parallel.expert");
    EXPECT_TRUE(
        Contains(e.what(), "parallel.expert (4) does not divide the data-parallel ranks (2)"))
        << e.what();
  }
  EXPECT_EQ(dst::config::resolve_layout(load("model: {preset: tiny-moe}\n"), 2).expert, 1);
}

// The experts' capacity (model.moe.capacity_factor): finite, >= 0, for an MoE model.
TEST(DeckErrors, MoeCapacityFactor) {
  EXPECT_EQ(load("model: {preset: tiny-moe}\n").model.moe.capacity_factor, 0.0);
  EXPECT_EQ(
      load("model: {preset: tiny-moe, moe: {capacity_factor: 1.25}}\n").model.moe.capacity_factor,
      1.25);
  EXPECT_TRUE(Contains(load_error("model: {preset: tiny-moe, moe: {capacity_factor: -1}}\n"),
                       "model.moe.capacity_factor"));
  EXPECT_TRUE(Contains(load_error("model: {preset: tiny-moe, moe: {capacity_factor: .nan}}\n"),
                       "model.moe.capacity_factor"));
  EXPECT_TRUE(Contains(load_error("model: {preset: tiny-moe, moe: {capacity_factor: .inf}}\n"),
                       "model.moe.capacity_factor"));
  EXPECT_TRUE(Contains(load_error("model:\n  moe:\n    capacity_factor: 1.0\n"),
                       "model.moe.capacity_factor needs a DeepSeekMoE model"));
}

// Node-limited routing (model.moe.max_nodes_per_token) and its test node map
// (debug.expert_nodes).
TEST(DeckErrors, NodeLimitedRouting) {
  const RunConfig c =
      load("model: {preset: tiny-moe, moe: {max_nodes_per_token: 2}}\ndebug: {expert_nodes: 4}\n");
  EXPECT_EQ(c.model.moe.max_nodes_per_token, 2);
  EXPECT_EQ(c.debug.expert_nodes, 4);
  EXPECT_TRUE(Contains(load_error("model:\n  moe:\n    max_nodes_per_token: 4\n"),
                       "model.moe.max_nodes_per_token 4 needs a DeepSeekMoE model"));
  EXPECT_TRUE(Contains(load_error("model: {preset: tiny-moe, moe: {max_nodes_per_token: -1}}\n"),
                       "model.moe.max_nodes_per_token"));
  EXPECT_TRUE(Contains(load_error("model: {preset: tiny-moe, n_group: 4, topk_group: 2, moe: "
                                  "{max_nodes_per_token: 2}}\n"),
                       "model.moe.max_nodes_per_token 2 and group-limited routing "
                       "(model.topk_group 2 of model.n_group 4 groups) are not combined"));
  EXPECT_EQ(load("model: {preset: tiny-moe, n_group: 4, topk_group: 4, moe: "
                 "{max_nodes_per_token: 2}}\n")
                .model.moe.max_nodes_per_token,
            2);
  EXPECT_TRUE(Contains(load_error("model: {preset: tiny-moe}\ndebug: {expert_nodes: 3}\n"),
                       "debug.expert_nodes (3) does not divide model.n_routed_experts (8)"));
  // tiny-moe: top-2 of 8 experts; 1 node of 8 / 8 = 1 expert cannot hold 2.
  EXPECT_TRUE(Contains(load_error("model: {preset: tiny-moe, moe: {max_nodes_per_token: 1}}\n"
                                  "debug: {expert_nodes: 8}\n"),
                       "is fewer than model.num_experts_per_tok (2)"));
  EXPECT_TRUE(Contains(load_error("debug: {expert_nodes: 2}\n"), "debug.expert_nodes"));
}

// ZeRO: stages 0-2, typed in the resolved deck; the NCCL back end has no shard
// collectives yet, so the deck refuses the pair, naming the stage.
TEST(DeckErrors, ZeroStageIsZeroToTwoAndNotWithNccl) {
  EXPECT_EQ(load("run: {}\n").parallel.zero_stage, 0);
  EXPECT_EQ(load("parallel: {zero_stage: 2}\n").parallel.zero_stage, 2);
  EXPECT_TRUE(Contains(load_error("parallel:\n  zero_stage: 3\n"), "parallel.zero_stage"));
  EXPECT_TRUE(Contains(load_error("parallel:\n  zero_stage: -1\n"), "parallel.zero_stage"));
  EXPECT_EQ(load_error("parallel: {backend: nccl}\n", {"parallel.zero_stage=1"}),
            "--set parallel.zero_stage=1: parallel.zero_stage: parallel.zero_stage 1 is not "
            "supported with parallel.backend nccl yet (ZeRO's reduce-scatter onto shards exists "
            "for the mpi and shm back ends)");
  EXPECT_TRUE(Contains(dst::config::to_yaml(load("parallel: {zero_stage: 1}\n")), "zero_stage: 1"));
}

// ZeRO's sharded fp32 master (bf16/fp16) and DeepSeekMoE's moving correction bias compose
// (the trainer moves the master shards' biases: GradSync::bias_moved); refused until
// 2026-12-07.
TEST(DeckErrors, ZeroWithSixteenBitMasterTakesAMovingMoeBias) {
  const std::string moe = "model: {preset: tiny-moe}\nparallel: {zero_stage: 1}\n";
  EXPECT_EQ(load(moe + "training: {precision: bf16}\n").parallel.zero_stage, 1);
  EXPECT_EQ(load(moe + "training: {precision: fp16}\n").parallel.zero_stage, 1);
  EXPECT_EQ(load(moe).parallel.zero_stage, 1);  // fp32
  EXPECT_GT(load(moe + "training: {precision: bf16}\n").model.moe.bias_update_rate, 0.0);
  EXPECT_EQ(load("model: {preset: tiny}\nparallel: {zero_stage: 2}\ntraining: {precision: bf16}\n")
                .parallel.zero_stage,
            2);
}

TEST(DeckErrors, LatentAttentionAndMoeShapes) {
  EXPECT_EQ(load_error("model:\n  q_lora_rank: 32\n"),
            "deck.yaml:2:16: model.q_lora_rank: model.q_lora_rank (32) is set but "
            "model.kv_lora_rank is 0 (standard attention); set model.kv_lora_rank > 0 for "
            "multi-head latent attention");
  EXPECT_TRUE(Contains(load_error("model:\n  preset: tiny-moe\n  qk_rope_head_dim: 7\n"),
                       "model.qk_rope_head_dim (7) must be even and > 0"));
  EXPECT_TRUE(Contains(load_error("model:\n  preset: tiny-moe\n  num_experts_per_tok: 9\n"),
                       "model.num_experts_per_tok (9) must be in [1, model.n_routed_experts = 8]"));
  EXPECT_TRUE(Contains(load_error("model:\n  preset: tiny-moe\n  n_group: 3\n"),
                       "model.n_group (3) does not divide model.n_routed_experts (8)"));
  EXPECT_TRUE(
      Contains(load_error("model:\n  preset: tiny-moe\n  n_group: 4\n  num_experts_per_tok: 3\n"),
               "exceeds the experts of the kept groups"));
  EXPECT_TRUE(Contains(load_error("model:\n  preset: tiny-moe\n  first_k_dense_replace: 4\n"),
                       "leaves no MoE block among model.n_layers = 4"));
  EXPECT_TRUE(Contains(load_error("model:\n  preset: tiny-moe\n  moe:\n    score: tanh\n"),
                       "model.moe.score"));
  // YaRN: latent attention only, beta_slow below beta_fast.
  EXPECT_TRUE(Contains(load_error("model:\n  rope_scaling: {type: yarn, factor: 4}\n"),
                       "model.rope_scaling.type yarn is implemented for multi-head latent "
                       "attention (DeepSeek-V2/V3) only"));
  EXPECT_TRUE(Contains(
      load_error("model:\n  preset: tiny-moe\n  rope_scaling: {type: yarn, beta_slow: 32}\n"),
      "model.rope_scaling.beta_slow (32.000000) must be below model.rope_scaling.beta_fast"));
  EXPECT_TRUE(Contains(load_error("model:\n  preset: tiny-moe\n  rope_scaling: {factor: 0.5}\n"),
                       "model.rope_scaling.factor"));
  const auto yarn = load("model:\n  preset: tiny-moe\n  rope_scaling: {type: yarn, factor: 40}\n");
  EXPECT_EQ(yarn.model.rope_scaling.type, dst::config::RopeScalingType::yarn);
  EXPECT_EQ(yarn.model.rope_scaling.factor, 40.0);
}

TEST(DeckErrors, UnknownPresetListsPresets) {
  EXPECT_EQ(load_error("model:\n  preset: huge\n"),
            "deck.yaml:2:11: model.preset: unknown preset 'huge' (presets: tiny, small, "
            "deepseek-1b, deepseek-llm-7b, deepseek-llm-67b, tiny-moe, deepseek-v2-lite, "
            "deepseek-v3)");
}

TEST(DeckErrors, InconsistentCombinationsNameEveryKey) {
  struct Case {
    const char* deck;
    std::vector<std::string> parts;
  };
  const Case cases[] = {
      {"model:\n  d_model: 100\n  n_heads: 3\n",
       {"deck.yaml:2:", "model.d_model (100) is not divisible by model.n_heads (3)"}},
      {"model:\n  d_model: 20\n  n_heads: 4\n  n_kv_heads: 1\n",
       {"model.d_model / model.n_heads", "= 5 is odd", "RoPE"}},
      {"model:\n  n_heads: 8\n  n_kv_heads: 3\n",
       {"deck.yaml:3:", "model.n_heads (8) is not divisible by model.n_kv_heads (3)"}},
      {"data:\n  seq_len: 512\n",
       {"deck.yaml:2:12: data.seq_len:", "data.seq_len (512) exceeds model.max_seq_len (256)"}},
      {"training:\n  global_batch_size: 10\n  micro_batch_size: 4\n",
       {"deck.yaml:2:",
        "training.global_batch_size (10) is not a multiple of "
        "training.micro_batch_size (4)"}},
      {"training:\n  global_batch_size: 16\n  grad_accum_steps: 2\n",
       {"deck.yaml:3:",
        "training.global_batch_size (16) and training.grad_accum_steps (2) are "
        "both set"}},
      {"training:\n  global_batch_size: 0\n",
       {"training.global_batch_size is 0", "training.grad_accum_steps is not set"}},
      {"model:\n  mtp_depth: 1\ndata:\n  seq_len: 1\n",
       {"deck.yaml:2:", "model.mtp_depth 1 needs data.seq_len >= 2 (got 1)"}},
      {"training:\n  schedule:\n    milestones: [0.5]\n",
       {"training.schedule.milestones has 1 entries but training.schedule.factors has 2"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.deck);
    const std::string e = load_error(c.deck);
    for (const std::string& p : c.parts)
      EXPECT_TRUE(Contains(e, p));
  }
  // A preset's max_seq_len takes part like an explicit one.
  EXPECT_TRUE(Contains(load_error("model: {preset: tiny}\ndata: {seq_len: 4096}\n"),
                       "data.seq_len (4096) exceeds model.max_seq_len (256)"));
}

TEST(DeckErrors, YamlFeaturesDecksRefuse) {
  EXPECT_TRUE(Contains(load_error("run:\n  name: a\n  name: b\n"),
                       "deck.yaml:3:3: duplicate key 'name' (first given at deck.yaml:2:3)"));
  EXPECT_TRUE(Contains(load_error("run: &r {name: a}\n"), "anchors"));
  // An alias needs an anchor, so yaml-cpp refuses it first (undefined anchor).
  EXPECT_TRUE(Contains(load_error("run: {name: a}\nmodel: *r\n"), "anchor"));
  EXPECT_TRUE(
      Contains(load_error("run: {name: a}\n---\nrun: {}\n"), "more than one YAML document"));
  EXPECT_TRUE(Contains(load_error("run: {seed: !!int 5}\n"), "explicit YAML tag"));
  EXPECT_TRUE(Contains(load_error("? [a, b]\n: 1\n"), "keys must be names"));
  // !!str is the one tag allowed: it makes a string, not a number.
  EXPECT_EQ(load("run: {name: !!str 5}\n").run.name, "5");
}

TEST(DeckErrors, ValidateChecksConfigsBuiltInCode) {
  RunConfig c;
  EXPECT_NO_THROW(dst::config::validate(c));
  c.training.optimizer.lr = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THROW(dst::config::validate(c), DeckError);
  c = RunConfig{};
  c.model.n_kv_heads = 3;
  try {
    dst::config::validate(c);
    ADD_FAILURE() << "no error";
  } catch (const DeckError& e) {
    EXPECT_EQ(e.key(), "model.n_kv_heads");
    EXPECT_EQ(e.where(), "");
  }
}

// ---------------------------------------------------------------------------------------
// Overrides
// ---------------------------------------------------------------------------------------

TEST(DeckOverrides, ParseOverride) {
  const Override o = parse_override("training.max_steps=10");
  EXPECT_EQ(o.path, "training.max_steps");
  EXPECT_EQ(o.value, "10");
  EXPECT_EQ(o.text, "training.max_steps=10");
  EXPECT_EQ(parse_override("run.name=a=b").value, "a=b");
  EXPECT_EQ(parse_override("data.train=").value, "");
  EXPECT_THROW(parse_override("training.max_steps"), DeckError);
  EXPECT_THROW(parse_override("=10"), DeckError);
  EXPECT_THROW(parse_override("training..max_steps=10"), DeckError);
  EXPECT_THROW(parse_override("training.=10"), DeckError);
  try {
    parse_override("max_steps");
    ADD_FAILURE() << "no error";
  } catch (const DeckError& e) {
    EXPECT_TRUE(Contains(e.what(), "--set max_steps: expected path=value"));
  }
}

TEST(DeckOverrides, ValidOverridesWin) {
  const RunConfig c =
      load(kExampleDeck,
           {"training.max_steps=10", "training.schedule.warmup_steps=5",
            "training.optimizer.betas=[0.8, 0.9]", "run.name='my run'", "parallel.data=2"});
  EXPECT_EQ(c.training.max_steps, 10);
  EXPECT_EQ(c.training.optimizer.betas[0], 0.8);
  EXPECT_EQ(c.training.optimizer.betas[1], 0.9);
  EXPECT_EQ(c.run.name, "my run");
  EXPECT_EQ(c.parallel.data, 2);
  // Later overrides win over earlier ones.
  EXPECT_EQ(load("run: {}\n", {"run.seed=1", "run.seed=2"}).run.seed, 2u);
}

TEST(DeckOverrides, CreatesMissingSections) {
  const RunConfig c = load("run: {}\n", {"training.optimizer.lr=0.01", "debug.nan_policy=skip"});
  EXPECT_EQ(c.training.optimizer.lr, 0.01);
  EXPECT_EQ(c.debug.nan_policy, dst::config::NanPolicy::skip);
  EXPECT_EQ(load("training:\n", {"training.max_steps=50"}).training.max_steps, 50);
}

TEST(DeckOverrides, ErrorsNameTheOverride) {
  EXPECT_EQ(load_error(kExampleDeck, {"training.max_steps=abc"}),
            "--set training.max_steps=abc: training.max_steps: expected an integer, got 'abc'");
  EXPECT_EQ(load_error(kExampleDeck, {"training.max_stpes=10"}),
            "--set training.max_stpes=10: training.max_stpes: unknown key (did you mean "
            "'training.max_steps'?)");
  EXPECT_EQ(load_error("run: {}\n", {"bogus.x=1"}), "--set bogus.x=1: bogus: unknown key");
  EXPECT_EQ(load_error(kExampleDeck, {"training.max_steps=-1"}),
            "--set training.max_steps=-1: training.max_steps: must be >= 1, got -1");
  EXPECT_TRUE(Contains(load_error(kExampleDeck, {"training.optimizer.betas=[0.9"}),
                       "--set training.optimizer.betas=[0.9: unclosed '['"));
  EXPECT_EQ(load_error(kExampleDeck, {"run.name.first=x"}),
            "--set run.name.first=x: run.name: is a value, not a section; cannot set 'first' "
            "inside it");
  EXPECT_TRUE(Contains(load_error(kExampleDeck, {"debug.deterministic=yes"}),
                       "--set debug.deterministic=yes: debug.deterministic: expected a boolean"));
  // Combination errors point at the override that broke the combination.
  EXPECT_TRUE(Contains(load_error(kExampleDeck, {"training.grad_accum_steps=2"}),
                       "--set training.grad_accum_steps=2: training.grad_accum_steps:"));
}

// ---------------------------------------------------------------------------------------
// Presets
// ---------------------------------------------------------------------------------------

TEST(DeckPresets, PresetFillsModelSection) {
  const RunConfig c = load("model:\n  preset: deepseek-llm-67b\n");
  EXPECT_EQ(c.model.preset, "deepseek-llm-67b");
  EXPECT_EQ(c.model.vocab_size, 102400);
  EXPECT_EQ(c.model.d_model, 8192);
  EXPECT_EQ(c.model.n_layers, 95);
  EXPECT_EQ(c.model.n_heads, 64);
  EXPECT_EQ(c.model.n_kv_heads, 8);
  EXPECT_EQ(c.model.ffn_dim, 22016);
  EXPECT_EQ(c.model.max_seq_len, 4096);
  EXPECT_EQ(c.data.seq_len, 4096);  // defaults to the model's max_seq_len

  const RunConfig s = load("model: {preset: small}\n");
  EXPECT_EQ(s.model.vocab_size, 4096);
  EXPECT_EQ(s.model.d_model, 512);
  EXPECT_EQ(s.model.n_layers, 8);
  EXPECT_EQ(s.model.ffn_dim, 1376);
  EXPECT_EQ(s.data.seq_len, 512);

  const RunConfig b = load("model: {preset: deepseek-llm-7b}\n");
  EXPECT_EQ(b.model.n_layers, 30);
  EXPECT_EQ(b.model.n_kv_heads, 32);
  EXPECT_EQ(b.model.ffn_dim, 11008);
  EXPECT_EQ(b.model.rope_theta, 10000.0);
  EXPECT_EQ(b.model.norm_eps, 1e-6);
}

TEST(DeckPresets, DeepSeek1bIsThe7bRecipeScaledDown) {
  const RunConfig c = load("model: {preset: deepseek-1b}\n");
  EXPECT_EQ(c.model.preset, "deepseek-1b");
  EXPECT_EQ(c.model.vocab_size, 102400);
  EXPECT_EQ(c.model.d_model, 2048);
  EXPECT_EQ(c.model.n_layers, 24);
  EXPECT_EQ(c.model.n_heads, 16);
  EXPECT_EQ(c.model.n_kv_heads, 16);
  EXPECT_EQ(c.model.ffn_dim, 5504);
  EXPECT_EQ(c.model.max_seq_len, 2048);
  EXPECT_EQ(c.data.seq_len, 2048);
  // The rest as the DeepSeek-LLM presets.
  const auto seven = dst::config::preset_model("deepseek-llm-7b");
  EXPECT_EQ(c.model.rope_theta, seven.rope_theta);
  EXPECT_EQ(c.model.norm_eps, seven.norm_eps);
  EXPECT_FALSE(c.model.tie_embeddings);
  // The GPU throughput deck's shape: bf16 at seq 2048 (inputs/gpu/deepseek-1b.yaml).
  EXPECT_NO_THROW(load("model: {preset: deepseek-1b}\ntraining: {precision: bf16}\n",
                       {"training.micro_batch_size=8", "training.global_batch_size=8"}));
}

TEST(DeckPresets, ExplicitKeysAndOverridesWin) {
  const RunConfig c = load("model:\n  preset: small\n  n_layers: 2\ndata: {seq_len: 128}\n",
                           {"model.d_model=1024"});
  EXPECT_EQ(c.model.n_layers, 2);
  EXPECT_EQ(c.model.d_model, 1024);
  EXPECT_EQ(c.model.vocab_size, 4096);
  EXPECT_EQ(c.data.seq_len, 128);
  // The preset itself can be overridden; explicit keys still win over the new preset.
  const RunConfig d = load("model:\n  preset: tiny\n  n_layers: 3\n", {"model.preset=small"});
  EXPECT_EQ(d.model.preset, "small");
  EXPECT_EQ(d.model.d_model, 512);
  EXPECT_EQ(d.model.n_layers, 3);
}

TEST(DeckPresets, NamesMatchSchema) {
  const std::vector<std::string> names = dst::config::preset_names();
  ASSERT_EQ(names.size(), 8u);
  for (const auto& k : dst::config::schema_keys()) {
    if (k.path != "model.preset") continue;
    for (const std::string& n : names)
      EXPECT_TRUE(Contains(k.allowed, "`" + n + "`"));
  }
  for (const std::string& n : names)
    EXPECT_EQ(dst::config::preset_model(n).preset, n);
  EXPECT_THROW(dst::config::preset_model("nope"), DeckError);
  // Every preset is itself a valid model.
  for (const std::string& n : names)
    EXPECT_NO_THROW(load("model: {preset: " + n + "}\n"));
}

// ---------------------------------------------------------------------------------------
// Layout
// ---------------------------------------------------------------------------------------

Layout layout_of(int world, int data, int tensor, int pipeline, std::int64_t accum,
                 std::int64_t global) {
  Layout l;
  l.world_size = world;
  l.data = data;
  l.tensor = tensor;
  l.pipeline = pipeline;
  l.grad_accum_steps = accum;
  l.global_batch_size = global;
  return l;
}

std::string layout_error(const RunConfig& c, int world) {
  try {
    dst::config::resolve_layout(c, world);
  } catch (const DeckError& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(DeckLayout, DataParallelOnOneTwoFourEightRanks) {
  const RunConfig c = load("training: {global_batch_size: 32, micro_batch_size: 4}\n");
  using dst::config::resolve_layout;
  EXPECT_EQ(resolve_layout(c, 1), layout_of(1, 1, 1, 1, 8, 32));
  EXPECT_EQ(resolve_layout(c, 2), layout_of(2, 2, 1, 1, 4, 32));
  EXPECT_EQ(resolve_layout(c, 4), layout_of(4, 4, 1, 1, 2, 32));
  EXPECT_EQ(resolve_layout(c, 8), layout_of(8, 8, 1, 1, 1, 32));
  const std::string e = layout_error(c, 16);
  EXPECT_TRUE(Contains(e,
                       "training.global_batch_size (32) is not divisible by "
                       "training.micro_batch_size (4) x data-parallel ranks (16) = 64"));
  EXPECT_TRUE(Contains(e, "world size 16"));
}

TEST(DeckLayout, EveryRankIsADataRank) {
  const RunConfig c =
      load("parallel: {data: 2}\ntraining: {global_batch_size: 16, micro_batch_size: 4}\n");
  EXPECT_EQ(dst::config::resolve_layout(c, 2), layout_of(2, 2, 1, 1, 2, 16));
  EXPECT_TRUE(Contains(layout_error(c, 4),
                       "world size 4: parallel.data: parallel.data (2) must be the world size / "
                       "(parallel.pipeline x parallel.tensor) (4 / 1 = 4) or auto"));
}

TEST(DeckLayout, ValidatesTensorParallelismBuiltInCode) {
  // resolve_layout validates first: a config built in code cannot slip a split through
  // that does not divide the heads.
  RunConfig c;
  c.parallel.tensor = 3;
  try {
    dst::config::resolve_layout(c, 2);
    ADD_FAILURE() << "no error";
  } catch (const DeckError& e) {
    EXPECT_EQ(e.key(), "parallel.tensor");
  }
}

TEST(DeckLayout, AccumulationGivenInsteadOfGlobalBatch) {
  const RunConfig c =
      load("training: {global_batch_size: 0, grad_accum_steps: 3, micro_batch_size: 2}\n");
  EXPECT_EQ(dst::config::resolve_layout(c, 4), layout_of(4, 4, 1, 1, 3, 24));
  EXPECT_EQ(dst::config::resolve_layout(c, 1), layout_of(1, 1, 1, 1, 3, 6));
  EXPECT_THROW(dst::config::resolve_layout(c, 0), dst::Error);
}

// Pipeline parallelism: stages, blocks per stage (even by default), the 1F1B schedule;
// what stages do not hold yet is refused naming the key.
TEST(DeckPipeline, StagesAndTheirBlocks) {
  const RunConfig even = load("parallel: {pipeline: 2}\n");  // tiny: 4 blocks
  EXPECT_EQ(even.parallel.pipeline, 2);
  EXPECT_EQ(dst::config::pipeline_stage_layers(even), (std::vector<std::int64_t>{2, 2}));
  const RunConfig three = load("model: {n_layers: 5}\nparallel: {pipeline: 3}\n");
  EXPECT_EQ(dst::config::pipeline_stage_layers(three), (std::vector<std::int64_t>{2, 2, 1}));
  const RunConfig uneven =
      load("model: {n_layers: 5}\nparallel: {pipeline: 2, pipeline_layers: [1, 4]}\n");
  EXPECT_EQ(dst::config::pipeline_stage_layers(uneven), (std::vector<std::int64_t>{1, 4}));
  EXPECT_EQ(load("run: {}\n", {"parallel.pipeline_schedule=1f1b"}).parallel.pipeline_schedule,
            dst::config::PipelineSchedule::one_f_one_b);
  // Interleaved: one entry per virtual stage, chunk c of rank p being virtual stage c P + p.
  const RunConfig virt = load(
      "model: {n_layers: 7}\nparallel: {pipeline: 2, pipeline_schedule: interleaved, "
      "virtual_stages: 3}\n");
  EXPECT_EQ(dst::config::pipeline_stage_layers(virt),
            (std::vector<std::int64_t>{2, 1, 1, 1, 1, 1}));
  const RunConfig virt_uneven = load(
      "parallel: {pipeline: 2, pipeline_schedule: interleaved, virtual_stages: 2, "
      "pipeline_layers: [1, 1, 1, 1]}\n");
  EXPECT_EQ(dst::config::pipeline_stage_layers(virt_uneven),
            (std::vector<std::int64_t>{1, 1, 1, 1}));
  // The layout: data x pipeline ranks.
  const RunConfig c =
      load("parallel: {pipeline: 2}\ntraining: {global_batch_size: 16, micro_batch_size: 2}\n");
  EXPECT_EQ(dst::config::resolve_layout(c, 4), layout_of(4, 2, 1, 2, 4, 16));
  EXPECT_EQ(dst::config::resolve_layout(c, 2), layout_of(2, 1, 1, 2, 8, 16));
  EXPECT_TRUE(Contains(layout_error(c, 3),
                       "world size 3: parallel.pipeline: parallel.pipeline x parallel.tensor (2 x "
                       "1) does not divide the world size 3"));
  const RunConfig d = load(
      "parallel: {pipeline: 2, data: 1}\ntraining: {global_batch_size: 16, micro_batch_size: 2}\n");
  EXPECT_TRUE(Contains(layout_error(d, 4),
                       "parallel.data (1) must be the world size / (parallel.pipeline x "
                       "parallel.tensor) (4 / 2 = 2) or auto"));
}

TEST(DeckPipeline, RefusesWhatStagesDoNotSupport) {
  EXPECT_EQ(load_error("parallel: {pipeline: 5}\n"),
            "deck.yaml:1:22: parallel.pipeline: parallel.pipeline (5) exceeds model.n_layers (4): "
            "every stage needs at least one block");
  EXPECT_TRUE(Contains(load_error("parallel: {pipeline: 2, pipeline_layers: [4]}\n"),
                       "parallel.pipeline_layers: parallel.pipeline_layers has 1 entries; it needs "
                       "one per pipeline stage (parallel.pipeline 2)"));
  EXPECT_TRUE(Contains(load_error("parallel: {pipeline: 2, pipeline_layers: [1, 2]}\n"),
                       "parallel.pipeline_layers sums to 3 blocks; it must sum to model.n_layers "
                       "(4)"));
  EXPECT_TRUE(Contains(load_error("parallel: {pipeline: 2, pipeline_layers: [4, 0]}\n"),
                       "parallel.pipeline_layers[1] must be in [1, 2147483647], got 0"));
  EXPECT_TRUE(Contains(load_error("parallel: {pipeline: 2, pipeline_layers: [1.5, 0.5]}\n"),
                       "parallel.pipeline_layers[0]"));
  EXPECT_TRUE(Contains(load_error("parallel: {pipeline: 2, pipeline_schedule: interleaved}\n"),
                       "parallel.pipeline_schedule: parallel.pipeline_schedule: interleaved needs "
                       "parallel.virtual_stages >= 2"));
  const RunConfig odd = load(
      "parallel: {pipeline: 2, pipeline_schedule: interleaved, virtual_stages: 2}\n"
      "training: {global_batch_size: 6, micro_batch_size: 2}\n");
  EXPECT_TRUE(Contains(layout_error(odd, 2),
                       "training.global_batch_size: parallel.pipeline_schedule interleaved runs "
                       "the micro-batches in groups of the 2 pipeline stages, but a step has 3"));
  const RunConfig even = load(
      "parallel: {pipeline: 2, pipeline_schedule: interleaved, virtual_stages: 2}\n"
      "training: {global_batch_size: 8, micro_batch_size: 2}\n");
  EXPECT_EQ(dst::config::resolve_layout(even, 2).grad_accum_steps, 4);
  EXPECT_TRUE(Contains(load_error("parallel: {pipeline: 2, virtual_stages: 2}\n"),
                       "parallel.virtual_stages: parallel.virtual_stages 2 needs "
                       "parallel.pipeline_schedule: interleaved"));
  EXPECT_TRUE(Contains(
      load_error("parallel: {pipeline: 2, pipeline_schedule: interleaved, virtual_stages: 3}\n"),
      "parallel.virtual_stages: parallel.pipeline (2) x virtual_stages (3) exceeds "
      "model.n_layers (4): every virtual stage needs at least one block"));
  EXPECT_TRUE(Contains(load_error("parallel: {pipeline: 2, pipeline_schedule: interleaved, "
                                  "virtual_stages: 2, pipeline_layers: [1, 3]}\n"),
                       "parallel.pipeline_layers has 2 entries; it needs one per virtual stage "
                       "(parallel.pipeline 2 x virtual_stages 2 = 4)"));
  EXPECT_EQ(load("model: {preset: tiny-moe}\nparallel: {pipeline: 2, "
                 "pipeline_schedule: interleaved, virtual_stages: 2}\n")
                .parallel.virtual_stages,
            2);  // DeepSeekMoE blocks in chunks too
  EXPECT_TRUE(Contains(load_error("parallel: {pipeline: 2, pipeline_schedule: gpipe}\n"),
                       "expected one of 1f1b, interleaved"));
  // Stages hold DeepSeekMoE blocks and latent attention, also with expert parallelism (the
  // expert group lies within a stage's data group).
  EXPECT_EQ(load_error("model: {preset: tiny-moe}\n", {"parallel.pipeline=2"}), "<no error>");
  EXPECT_EQ(
      load_error("model: {preset: tiny-moe}\nparallel: {expert: 2}\n", {"parallel.pipeline=2"}),
      "<no error>");
  // The MTP module and tied embeddings with stages: the last stage holds a copy of the
  // embedding table (model/stage.hpp), MoE or not, interleaved or not.
  EXPECT_EQ(load_error("model: {preset: tiny-moe, mtp_depth: 1}\n", {"parallel.pipeline=2"}),
            "<no error>");
  EXPECT_EQ(load_error("model: {tie_embeddings: true, mtp_depth: 1}\nparallel: {pipeline: 2, "
                       "pipeline_schedule: interleaved, virtual_stages: 2}\n"),
            "<no error>");
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"kernels: {backend: cuda}\n", "kernels.backend: kernels.backend cuda"},
      {"parallel: {backend: nccl}\n", "parallel.backend: parallel.backend nccl"},
  };
  for (const auto& [text, message] : refused) {
    const std::string e = load_error(text, {"parallel.pipeline=2"});
    EXPECT_TRUE(Contains(e, message)) << text;
    EXPECT_TRUE(Contains(e, "is not supported yet with parallel.pipeline 2")) << text;
    EXPECT_EQ(load_error(text), "<no error>") << text;  // fine without stages
  }
}

// ---------------------------------------------------------------------------------------
// YAML round trip
// ---------------------------------------------------------------------------------------

// One override per schema key, every value different from its default and from the
// `small` preset (and valid with any one left out), but for the keys with one legal value:
// training.optimizer.type, parallel.tensor and parallel.pipeline.
const std::vector<std::string> kEveryKeyChanged = {
    "run.name='my run: \"x\" #1'",
    "run.seed=18446744073709551615",
    "run.output_dir=/scratch/out dir",
    "model.preset=small",
    "model.vocab_size=1000",
    "model.d_model=1024",
    "model.n_layers=3",
    "model.n_heads=16",
    "model.n_kv_heads=2",
    "model.ffn_dim=1500",
    "model.max_seq_len=300",
    "model.rope_theta=500000.0",
    "model.norm_eps=1e-5",
    "model.tie_embeddings=true",
    "model.q_lora_rank=48",
    "model.kv_lora_rank=32",
    "model.qk_nope_head_dim=24",
    "model.qk_rope_head_dim=16",
    "model.v_head_dim=20",
    "model.rope_scaling.type=yarn",
    "model.rope_scaling.factor=40",
    "model.rope_scaling.original_max_seq_len=2048",
    "model.rope_scaling.beta_fast=16",
    "model.rope_scaling.beta_slow=2",
    "model.rope_scaling.mscale=0.707",
    "model.rope_scaling.mscale_all_dim=0.707",
    "model.n_routed_experts=8",
    "model.n_shared_experts=2",
    "model.num_experts_per_tok=3",
    "model.moe_intermediate_size=64",
    "model.first_k_dense_replace=1",
    "model.n_group=4",
    "model.topk_group=4",  // every group kept: node-limited routing composes with it
    "model.norm_topk_prob=false",
    "model.routed_scaling_factor=2.5",
    "model.moe.score=softmax",
    "model.moe.bias_update_rate=0",
    "model.moe.seq_aux_loss_alpha=0.001",
    "model.moe.capacity_factor=1.5",
    "model.moe.max_nodes_per_token=2",
    "model.mtp_depth=1",
    "model.mtp_loss_weight=0.5",
    "data.train=data/train-[0-9]*.h5",
    "data.valid='123'",
    "data.seq_len=128",
    "data.format=text",
    "parallel.overlap=false",
    "debug.inject_divergence_rank=1",
    "data.text_separator='%%'",
    "training.max_steps=300",
    "training.stop_at_step=150",
    "training.global_batch_size=0",
    "training.micro_batch_size=4",
    "training.grad_accum_steps=3",
    "training.precision=bf16",
    "training.recompute=selective",
    "training.grad_clip=0.30000000000000004",
    "training.optimizer.type=adamw",
    "training.optimizer.lr=0.1",
    "training.optimizer.betas=[0.8, 0.999]",
    "training.optimizer.eps=1e-10",
    "training.optimizer.weight_decay=0",
    "training.schedule.type=multistep",
    "training.schedule.warmup_steps=7",
    "training.schedule.min_lr_ratio=0.05",
    "training.schedule.milestones=[0.25, 0.5]",
    "training.schedule.factors=[0.5, 0.25]",
    "training.schedule.world_size_scaling=sqrt",
    "training.schedule.reference_world_size=8",
    "parallel.data=2",
    "parallel.tensor=1",                 // one legal value here (above)
    "parallel.sequence_parallel=false",  // true needs parallel.tensor > 1
    "parallel.pipeline=1",
    "parallel.pipeline_layers=[3]",
    "parallel.pipeline_schedule=interleaved",  // refused only with more than one stage
    "parallel.virtual_stages=2",               // (so is this)
    "parallel.expert=2",                       // divides model.n_routed_experts (8) and data (2)
    "parallel.backend=shm",                    // not nccl: zero_stage > 0 is refused with it
    "parallel.zero_stage=2",
    "parallel.bucket_mb=12.5",
    "parallel.timeout_s=30",
    "parallel.init_timeout_s=45.5",
    "kernels.backend=cuda",
    "kernels.host_gemm=blas",
    "checkpoint.every_steps=0",
    "checkpoint.keep_last=1",
    "checkpoint.resume=/ckpt/step-100",
    "logging.every_steps=1",
    "logging.metrics_file=m.jsonl",
    "logging.peak_gflops=250",
    "eval.every_steps=0",
    "eval.batches=2",
    "debug.deterministic=false",
    "debug.consistency_every=0",
    "debug.nan_policy=skip",
    "debug.inject_nan_step=5",
    "debug.inject_overflow_step=6",
    "debug.inject_hang_rank=1",
    "debug.inject_hang_alltoallv_rank=0",
    "debug.inject_exit_rank=0",
    "debug.inject_exit_in_checkpoint=true",
    "debug.inject_read_delay_ms=20",
    "debug.inject_straggler_rank=1",
    "debug.inject_straggler_ms=250",
    "debug.expert_nodes=4",
};

TEST(DeckYaml, OverrideListCoversEverySchemaKey) {
  std::set<std::string> paths;
  for (const std::string& s : kEveryKeyChanged)
    paths.insert(parse_override(s).path);
  std::set<std::string> schema;
  for (const auto& k : dst::config::schema_keys())
    schema.insert(k.path);
  EXPECT_EQ(paths, schema);
  EXPECT_EQ(paths.size(), kEveryKeyChanged.size());
}

TEST(DeckYaml, DefaultRoundTrips) {
  const RunConfig c;
  EXPECT_EQ(load(dst::config::to_yaml(c)), c);
  const RunConfig example = load(kExampleDeck);
  EXPECT_EQ(load(dst::config::to_yaml(example)), example);
}

TEST(DeckYaml, EveryKeyChangedRoundTrips) {
  const RunConfig changed = load("run: {}\n", kEveryKeyChanged);
  EXPECT_EQ(changed.run.name, "my run: \"x\" #1");
  EXPECT_EQ(changed.run.seed, std::numeric_limits<std::uint64_t>::max());
  EXPECT_EQ(changed.data.valid, "123");
  const std::string yaml = dst::config::to_yaml(changed);
  const RunConfig back = load(yaml);
  EXPECT_EQ(back, changed) << yaml;
  EXPECT_EQ(dst::config::to_yaml(back), yaml);
}

TEST(DeckYaml, EqualityCoversEveryKey) {
  // Leaving out any one change must give a config that compares unequal: operator==
  // looks at every field. grad_accum_steps and global_batch_size only change together.
  const RunConfig changed = load("run: {}\n", kEveryKeyChanged);
  const RunConfig defaults;
  EXPECT_NE(changed, defaults);
  for (std::size_t i = 0; i < kEveryKeyChanged.size(); ++i) {
    std::vector<std::string> rest = kEveryKeyChanged;
    const std::string left_out = rest[i];
    rest.erase(rest.begin() + static_cast<std::ptrdiff_t>(i));
    SCOPED_TRACE(left_out);
    // adamw is the only optimizer; this MoE deck takes 1 tensor rank (so no sequence
    // parallelism) and the list 1 pipeline stage.
    if (left_out.rfind("training.optimizer.type", 0) == 0 ||
        left_out.rfind("parallel.tensor", 0) == 0 || left_out.rfind("parallel.pipeline", 0) == 0 ||
        left_out.rfind("parallel.sequence_parallel", 0) == 0)
      continue;
    // Keys whose default is invalid beside the others: latent attention's shape without
    // its rank or RoPE/value dims, MoE without its top-k or expert width, topk_group 2
    // with one group, top-3 from one kept group of 2 (topk_group 1), the blocks per stage
    // without their n_layers, expert parallelism without routed experts.
    const bool pairs_up = [&] {
      for (const char* k : {"model.kv_lora_rank", "model.qk_rope_head_dim", "model.v_head_dim",
                            "model.num_experts_per_tok", "model.moe_intermediate_size",
                            "model.n_group", "model.topk_group",
                            "model.n_layers",  // parallel.pipeline_layers [3] sums to it
                            "model.n_routed_experts"})
        if (left_out.rfind(std::string(k) + "=", 0) == 0) return true;
      return false;
    }();
    if (pairs_up || left_out.rfind("training.grad_accum_steps", 0) == 0 ||
        left_out.rfind("training.global_batch_size", 0) == 0) {
      EXPECT_THROW(load("run: {}\n", rest), DeckError);
      continue;
    }
    EXPECT_NE(load("run: {}\n", rest), changed);
  }
  RunConfig a;
  RunConfig b;
  b.training.grad_accum_steps = 3;
  EXPECT_NE(a, b);
  EXPECT_NE(a.training, b.training);
  b = a;
  b.training.global_batch_size = 0;
  EXPECT_NE(a, b);
}

TEST(DeckYaml, ShortestNumbersAndAuto) {
  RunConfig c;
  c.training.optimizer.lr = 0.1;
  c.model.rope_theta = 10000.0;
  const std::string yaml = dst::config::to_yaml(c);
  EXPECT_TRUE(Contains(yaml, "\n    lr: 0.1\n"));
  EXPECT_TRUE(Contains(yaml, "\n  rope_theta: 10000.0\n"));
  EXPECT_TRUE(Contains(yaml, "\n  data: auto\n"));
  EXPECT_TRUE(Contains(yaml, "\n    betas: [0.9, 0.95]\n"));
  // A "." in the mantissa: YAML 1.1 readers (PyYAML) read "1e-06" as a string.
  EXPECT_TRUE(Contains(yaml, "\n  norm_eps: 1.0e-06\n"));
  c.training.optimizer.lr = 0.1 + 0.2;
  EXPECT_TRUE(Contains(dst::config::to_yaml(c), "lr: 0.30000000000000004\n"));
}

TEST(DeckYaml, EverySectionAndKeyInSchemaOrder) {
  const std::string yaml = dst::config::to_yaml(RunConfig{});
  std::size_t pos = 0;
  for (const char* section :
       {"\nrun:\n", "\nmodel:\n", "\ndata:\n", "\ntraining:\n", "\n  optimizer:\n",
        "\n  schedule:\n", "\nparallel:\n", "\nkernels:\n", "\ncheckpoint:\n", "\nlogging:\n",
        "\neval:\n", "\ndebug:\n"}) {
    const std::size_t at = yaml.find(section, pos);
    ASSERT_NE(at, std::string::npos) << section;
    pos = at;
  }
  for (const auto& k : dst::config::schema_keys()) {
    const std::string leaf = k.path.substr(k.path.rfind('.') + 1);
    EXPECT_TRUE(Contains(yaml, " " + leaf + ": " + k.default_value + "\n"));
  }
}

// ---------------------------------------------------------------------------------------
// Schema and docs
// ---------------------------------------------------------------------------------------

TEST(DeckSchema, EveryKeyOfTheDesignNotesExists) {
  // The keys of the run-deck sketch (DECK.md) that runtime and app code rely on.
  const char* sketch[] = {"run.name",
                          "run.seed",
                          "run.output_dir",
                          "model.preset",
                          "model.vocab_size",
                          "model.d_model",
                          "model.n_layers",
                          "model.n_heads",
                          "model.n_kv_heads",
                          "model.ffn_dim",
                          "model.max_seq_len",
                          "model.rope_theta",
                          "model.norm_eps",
                          "model.tie_embeddings",
                          "data.train",
                          "data.valid",
                          "data.seq_len",
                          "training.max_steps",
                          "training.global_batch_size",
                          "training.micro_batch_size",
                          "training.grad_accum_steps",
                          "training.precision",
                          "training.grad_clip",
                          "training.optimizer.type",
                          "training.optimizer.lr",
                          "training.optimizer.betas",
                          "training.optimizer.eps",
                          "training.optimizer.weight_decay",
                          "training.schedule.type",
                          "training.schedule.warmup_steps",
                          "training.schedule.min_lr_ratio",
                          "training.schedule.milestones",
                          "training.schedule.factors",
                          "training.schedule.world_size_scaling",
                          "training.schedule.reference_world_size",
                          "parallel.data",
                          "parallel.tensor",
                          "parallel.pipeline",
                          "parallel.backend",
                          "parallel.bucket_mb",
                          "parallel.timeout_s",
                          "parallel.init_timeout_s",
                          "kernels.backend",
                          "checkpoint.every_steps",
                          "checkpoint.keep_last",
                          "checkpoint.resume",
                          "logging.every_steps",
                          "logging.metrics_file",
                          "eval.every_steps",
                          "eval.batches",
                          "debug.deterministic",
                          "debug.consistency_every",
                          "debug.nan_policy",
                          "debug.inject_nan_step",
                          "debug.inject_hang_rank",
                          "debug.inject_exit_rank",
                          "debug.inject_exit_in_checkpoint",
                          "debug.inject_read_delay_ms"};
  std::set<std::string> schema;
  for (const auto& k : dst::config::schema_keys()) {
    schema.insert(k.path);
    EXPECT_FALSE(k.doc.empty()) << k.path;
    EXPECT_FALSE(k.type.empty()) << k.path;
    EXPECT_FALSE(k.allowed.empty()) << k.path;
  }
  for (const char* k : sketch)
    EXPECT_EQ(schema.count(k), 1u) << k;
}

TEST(DeckSchema, KeyInfoDescribesTypesAndRanges) {
  for (const auto& k : dst::config::schema_keys()) {
    if (k.path == "training.optimizer.lr") {
      EXPECT_EQ(k.type, "number");
      EXPECT_EQ(k.default_value, "0.0003");
      EXPECT_EQ(k.allowed, "> 0");
    } else if (k.path == "training.precision") {
      EXPECT_EQ(k.type, "enum");
      EXPECT_EQ(k.allowed, "`fp32`, `bf16`, `fp16`");
    } else if (k.path == "parallel.data") {
      EXPECT_EQ(k.default_value, "auto");
    }
  }
}

TEST(DeckSchema, CommittedDocsContainGeneratedReference) {
  const std::string path = std::string(DSTRAIN_SOURCE_DIR) + "/docs/deck.md";
  std::ifstream in(path);
  ASSERT_TRUE(in) << "cannot open " << path;
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string reference = dst::config::deck_reference_markdown();
  EXPECT_NE(buffer.str().find(reference), std::string::npos)
      << path << " is out of date with the schema; regenerate its key reference with "
      << "build/tests/unit/config/deck_docgen";
  for (const auto& k : dst::config::schema_keys())
    EXPECT_TRUE(Contains(reference, "`" + k.path.substr(k.path.rfind('.') + 1) + "`"));
}

// A warm-up longer than the run is legal (a short smoke run of a long deck) but is said.
TEST(Deck, WarmupLongerThanRunIsAnAdvisoryNotAnError) {
  const auto c = load_deck_text("training:\n  max_steps: 10\n", "deck.yaml");
  const auto notes = advisories(c);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_TRUE(
      Contains(notes[0], "training.schedule.warmup_steps (20) exceeds training.max_steps (10)"));
  EXPECT_TRUE(advisories(load_deck_text("training:\n  max_steps: 30\n", "deck.yaml")).empty());
}

// '%' starts a YAML directive: unquoted it is no value at all, which must be an error,
// never a silently empty string.
TEST(DeckOverrides, ValueThatYamlReadsAsNothingIsRefused) {
  try {
    load_deck_text("{}", "deck.yaml", overrides_of({"data.text_separator=%"}));
    FAIL() << "no error";
  } catch (const DeckError& e) {
    EXPECT_TRUE(Contains(e.what(), "--set data.text_separator=%"));
    EXPECT_TRUE(Contains(e.what(), "quote it"));
  }
  EXPECT_EQ(load_deck_text("{}", "deck.yaml", overrides_of({"data.text_separator='%'"}))
                .data.text_separator,
            "%");
}

}  // namespace

// Tensor parallelism splits heads, kv heads, ffn columns and vocabulary rows: a size that
// does not divide one of them is refused naming both keys; what it is not built for
// (latent attention, DeepSeekMoE, MTP, tied embeddings, devices) likewise.
TEST(DeckTensor, WhatItMustDivideAndWhatItRefuses) {
  const RunConfig two = load("parallel:\n  tensor: 2\n");  // tiny: 4 heads, 688, 260
  EXPECT_EQ(two.parallel.tensor, 2);
  EXPECT_EQ(load("parallel: {tensor: 4}\n").parallel.tensor, 4);
  EXPECT_EQ(load_error("parallel:\n  tensor: 3\n"),
            "deck.yaml:2:11: parallel.tensor: parallel.tensor (3) does not divide model.n_heads "
            "(4): each rank of a tensor group holds the same share of the attention heads");
  try {
    load("parallel: {tensor: 8, pipeline: 2}\n");
    ADD_FAILURE() << "no error";
  } catch (const DeckError& e) {
    EXPECT_EQ(e.key(), "parallel.tensor");
  }
  // Fewer key/value heads than T: each is replicated on T / n_kv_heads ranks (the layout
  // says how many share one), which needs n_kv_heads to divide T.
  const RunConfig kv2 = load("model: {n_kv_heads: 2}\nparallel: {tensor: 4}\n");
  EXPECT_EQ(resolve_layout(kv2, 4).kv_replicas, 2);
  EXPECT_EQ(resolve_layout(load("model: {n_kv_heads: 1}\nparallel: {tensor: 4}\n"), 8).kv_replicas,
            4);
  EXPECT_EQ(resolve_layout(two, 2).kv_replicas, 1);
  try {
    load("model: {n_heads: 12, n_kv_heads: 6, d_model: 288}\nparallel: {tensor: 4}\n");
    ADD_FAILURE() << "no error";
  } catch (const DeckError& e) {
    EXPECT_EQ(e.key(), "parallel.tensor");
    EXPECT_TRUE(Contains(e.what(),
                         "parallel.tensor (4) neither divides nor is a multiple of "
                         "model.n_kv_heads (6)"))
        << e.what();
  }
  EXPECT_TRUE(Contains(load_error("model: {ffn_dim: 690}\nparallel: {tensor: 4}\n"),
                       "does not divide model.ffn_dim (690)"));
  EXPECT_TRUE(Contains(load_error("model: {vocab_size: 258}\nparallel: {tensor: 4}\n"),
                       "does not divide model.vocab_size (258)"));
  // DeepSeekMoE layers are computed whole on each rank of a tensor group (block.hpp), also
  // with sequence parallelism (on every row, gathered); the MTP module split as the model,
  // also with sequence parallelism (its rows split as the blocks').
  EXPECT_EQ(load_error("model: {preset: tiny-moe}\nparallel: {tensor: 2}\n"), "<no error>");
  EXPECT_EQ(load_error("model: {preset: tiny-moe}\nparallel: {tensor: 2, sequence_parallel: "
                       "true}\n"),
            "<no error>");
  EXPECT_EQ(load_error("model: {preset: tiny-moe, mtp_depth: 1}\nparallel: {tensor: 2}\n"),
            "<no error>");
  EXPECT_EQ(load_error("model: {mtp_depth: 1}\nparallel: {tensor: 2, sequence_parallel: true}\n"),
            "<no error>");
  EXPECT_EQ(load_error("model: {preset: tiny-moe, mtp_depth: 1}\nparallel: {tensor: 2, "
                       "sequence_parallel: true}\n"),
            "<no error>");
  // Latent attention splits by heads (its latents replicated), also with sequence parallelism.
  EXPECT_EQ(load_error("model: {preset: tiny-moe, n_routed_experts: 0}\nparallel: {tensor: 4, "
                       "sequence_parallel: true}\n"),
            "<no error>");
  EXPECT_TRUE(Contains(load_error("model: {preset: tiny-moe, n_routed_experts: 0}\nparallel: "
                                  "{tensor: 8}\n"),
                       "parallel.tensor (8) does not divide model.n_heads (4)"));
  // Tied embeddings split alike: the head reads the embedding's vocabulary rows.
  EXPECT_TRUE(load("model: {tie_embeddings: true}\nparallel: {tensor: 2}\n").model.tie_embeddings);
  EXPECT_TRUE(Contains(load_error("kernels: {backend: cuda}\nparallel: {tensor: 2}\n"),
                       "kernels.backend cuda"));
  // The layout: pipeline x data x tensor ranks.
  const RunConfig c = load(
      "parallel: {tensor: 2, pipeline: 2}\ntraining: {global_batch_size: 16, micro_batch_size: "
      "2}\n");
  EXPECT_EQ(resolve_layout(c, 8), layout_of(8, 2, 2, 2, 4, 16));
  EXPECT_EQ(resolve_layout(c, 4), layout_of(4, 1, 2, 2, 8, 16));
  EXPECT_TRUE(Contains(layout_error(c, 6),
                       "world size 6: parallel.tensor: parallel.pipeline x parallel.tensor (2 x 2) "
                       "does not divide the world size 6"));
  const RunConfig ones = load("parallel: {tensor: 1, pipeline: 1}\n");
  EXPECT_EQ(ones.parallel.tensor, 1);
  EXPECT_EQ(ones.parallel.pipeline, 1);
}

// Sequence parallelism splits a micro-batch's token rows over the tensor group: without a
// tensor group it would do nothing and is refused, as is a group that does not divide the
// rows; the message names the keys.
TEST(DeckSequence, NeedsATensorGroupThatDividesTheTokenRows) {
  EXPECT_FALSE(load("parallel: {tensor: 2}\n").parallel.sequence_parallel);
  const RunConfig sp = load("parallel: {tensor: 2, sequence_parallel: true}\n");
  EXPECT_TRUE(sp.parallel.sequence_parallel);
  EXPECT_EQ(load_error("parallel:\n  sequence_parallel: true\n"),
            "deck.yaml:2:22: parallel.sequence_parallel: parallel.sequence_parallel splits the "
            "token rows over the tensor group and does nothing with parallel.tensor 1; set "
            "parallel.tensor > 1 or parallel.sequence_parallel: false");
  // 4 ranks: 1 x 2 rows of a micro-batch do not split, 1 x 4 do.
  EXPECT_TRUE(Contains(load_error("model: {n_kv_heads: 4}\ndata: {seq_len: 2}\ntraining: "
                                  "{micro_batch_size: 1}\nparallel: {tensor: 4, "
                                  "sequence_parallel: true}\n"),
                       "parallel.tensor (4) does not divide training.micro_batch_size x "
                       "data.seq_len (1 x 2)"));
  EXPECT_TRUE(load("data: {seq_len: 4}\ntraining: {micro_batch_size: 1}\nparallel: {tensor: 4, "
                   "sequence_parallel: true}\n")
                  .parallel.sequence_parallel);
}
