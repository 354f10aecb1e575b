// The memory and communication plan (train/plan.hpp): memory per rank by precision,
// stages, ZeRO (the run's shards), recompute and MoE; the step time from the rate table;
// expert parallelism's all-to-all and node-limited routing.
#include <gtest/gtest.h>

#include <algorithm>

#include "config/deck.hpp"
#include "core/error.hpp"
#include "model/language_model.hpp"
#include "model/pipeline_schedule.hpp"
#include "model/plan.hpp"
#include "train/plan.hpp"
#include "train/zero_shards.hpp"

namespace {

// DeepSeek LLM 7B's published shapes (the deck's preset; model/plan_test checks them).
dst::config::ModelSection deepseek_llm_7b() {
  return dst::config::preset_model("deepseek-llm-7b");
}

TEST(Plan, MemoryScalesWithPrecisionNotWithLayout) {
  dst::config::RunConfig c;
  c.model = deepseek_llm_7b();
  c.data.seq_len = 4096;
  c.training.micro_batch_size = 1;
  dst::config::Layout one;
  one.global_batch_size = 8;
  const auto p32 = dst::train::make_plan(c, one);
  EXPECT_EQ(p32.memory.parameters, 4ull * 6910365696);
  EXPECT_EQ(p32.memory.optimizer, 8ull * 6910365696);
  EXPECT_EQ(p32.comm_bytes_per_step, 0.0);  // one rank: nothing to all-reduce

  c.training.precision = dst::config::Precision::bf16;
  const auto p16 = dst::train::make_plan(c, one);
  EXPECT_EQ(p16.memory.parameters, 2ull * 6910365696);  // the bf16 compute copy
  EXPECT_EQ(p16.memory.master, 4ull * 6910365696);      // fp32 master weights

  // Data-parallel ranks each hold the whole model; only the all-reduce appears.
  dst::config::Layout dp2 = one;
  dp2.world_size = 2;
  dp2.data = 2;
  const auto replicas = dst::train::make_plan(c, dp2);
  EXPECT_EQ(replicas.memory.gradients, p16.memory.gradients);
  EXPECT_EQ(replicas.memory.parameters, p16.memory.parameters);
  EXPECT_GT(replicas.comm_bytes_per_step, 0.0);
  // A tensor split the deck does not ask for is refused (the plan is of the deck's layout).
  dst::config::Layout claimed = one;
  claimed.world_size = 2;
  claimed.tensor = 2;
  EXPECT_THROW(dst::train::make_plan(c, claimed), dst::Error);
  // Tensor parallelism halves every split parameter (all but the 2 x 30 + 1 norms of
  // d_model weights) and adds the tensor group's activation all-reduces: 4 per block and 2
  // per micro-batch of 1 x 4096 x 4096 fp32 (64 MiB), 2 (T-1)/T of it sent per rank; the
  // data group's collectives (comm_bytes_per_step) are not among them.
  c.parallel.tensor = 2;
  const auto tp2 = dst::train::make_plan(c, claimed);
  const std::uint64_t norms = 61ull * 4096;
  EXPECT_EQ(tp2.memory.parameters, 2ull * ((6910365696ull - norms) / 2 + norms));
  EXPECT_EQ(tp2.memory.master, 2 * tp2.memory.parameters);
  EXPECT_LT(tp2.memory.activations, p16.memory.activations);
  EXPECT_EQ(tp2.tensor_allreduces_per_step, 4.0 * 30 + 2);  // one micro-batch a step
  EXPECT_DOUBLE_EQ(tp2.tensor_bytes_per_step, (4.0 * 30 + 2) * 64.0 * 1024 * 1024);
  EXPECT_EQ(tp2.comm_bytes_per_step, 0.0);
  // Sequence parallelism: the residual stream and the norms by token rows (fewer
  // activations; two (N, C) buffers more in the workspace), in all-reduce equivalents 5 per
  // block (the backward re-gathers the norms) and 2 at the ends, and an all-reduce of each
  // norm weight's gradient (4096 fp32; two per block and the final norm's).
  c.parallel.sequence_parallel = true;
  const auto sp2 = dst::train::make_plan(c, claimed);
  EXPECT_EQ(sp2.memory.parameters, tp2.memory.parameters);
  EXPECT_LT(sp2.memory.activations, tp2.memory.activations);
  EXPECT_EQ(sp2.memory.workspace, tp2.memory.workspace + 2ull * 64 * 1024 * 1024 + 4096 * 4);
  EXPECT_EQ(sp2.tensor_allreduces_per_step, 5.0 * 30 + 2 + 61);
  EXPECT_DOUBLE_EQ(sp2.tensor_bytes_per_step,
                   (5.0 * 30 + 2) * 64.0 * 1024 * 1024 + 61.0 * 4096 * 4);
  c.parallel.sequence_parallel = false;
  // One key/value head over TP=2: both ranks hold its k_proj and v_proj (2 x 128 x 4096 a
  // block) whole, and each block's backward all-reduces its key and value gradients, 1 x
  // 4096 x 128 fp32 (2 MiB) each, over the 2 ranks sharing the head (2 (R-1)/R = 1).
  c.model.n_kv_heads = 1;
  const auto kv1 = dst::train::make_plan(c, claimed);
  const std::uint64_t kv = 30ull * 2 * 128 * 4096;
  const std::uint64_t whole = 6910365696ull - 30ull * 2 * (4096 - 128) * 4096;
  EXPECT_EQ(kv1.memory.parameters, 2ull * ((whole - norms - kv) / 2 + norms + kv));
  EXPECT_EQ(kv1.tensor_allreduces_per_step, 4.0 * 30 + 2 + 2.0 * 30);
  EXPECT_DOUBLE_EQ(kv1.tensor_bytes_per_step,
                   (4.0 * 30 + 2) * 64.0 * 1024 * 1024 + 2.0 * 30 * 2.0 * 1024 * 1024);
}

// Pipeline stages: each stage planned with its own layers and records, the heaviest as the
// memory per rank; the bubble and the point-to-point bytes; a layout whose stages are not
// the deck's is refused.
TEST(Plan, PipelineStagesHoldTheirLayers) {
  dst::config::RunConfig c;
  c.model = deepseek_llm_7b();  // 30 blocks
  c.data.seq_len = 4096;
  c.training.micro_batch_size = 1;
  c.training.precision = dst::config::Precision::bf16;
  dst::config::Layout one;
  one.global_batch_size = 8;
  one.grad_accum_steps = 8;
  const auto whole = dst::train::make_plan(c, one);
  EXPECT_TRUE(whole.stages.empty());
  EXPECT_EQ(whole.bubble_fraction, 0.0);
  c.parallel.pipeline = 2;
  dst::config::Layout pp2 = one;
  pp2.world_size = 2;
  pp2.pipeline = 2;
  const auto staged = dst::train::make_plan(c, pp2);
  ASSERT_EQ(staged.stages.size(), 2u);
  EXPECT_EQ(staged.stages[0].first, 0);
  EXPECT_EQ(staged.stages[0].last, 15);
  EXPECT_EQ(staged.stages[1].last, 30);
  EXPECT_EQ(staged.stages[0].in_flight, 2);
  EXPECT_EQ(staged.stages[1].in_flight, 1);
  EXPECT_EQ(staged.stages[0].parameters + staged.stages[1].parameters, whole.params.total());
  EXPECT_DOUBLE_EQ(staged.bubble_fraction, 1.0 / 8.0);
  EXPECT_DOUBLE_EQ(staged.p2p_bytes_per_micro_batch, 4096.0 * 4096.0 * 4.0);
  // The sends' copies in flight: stage 0's activations (its 2 records), stage 1's
  // gradients (stage 0's 2 records: it keeps them until their gradients came back).
  EXPECT_EQ(staged.stages[0].sends_in_flight, 2);
  EXPECT_EQ(staged.stages[1].sends_in_flight, 2);
  EXPECT_EQ(staged.stages[1].memory.comm,
            static_cast<std::uint64_t>(2 * staged.p2p_bytes_per_micro_batch));
  // Half the blocks: about half the parameters' bytes per rank, the heaviest stage's.
  EXPECT_LT(staged.memory.parameters, whole.memory.parameters * 6 / 10);
  EXPECT_LT(staged.memory.total(), whole.memory.total());
  std::uint64_t heaviest = 0;
  for (const auto& s : staged.stages)
    heaviest = std::max(heaviest, s.memory.total());
  EXPECT_EQ(staged.memory.total(), heaviest);
  pp2.pipeline = 4;
  EXPECT_THROW(dst::train::make_plan(c, pp2), dst::Error);

  // Interleaved, 3 chunks per rank (6 virtual stages of 5 blocks): rank 0 holds blocks
  // 0-4, 10-14 and 20-24 with the records chunk_in_flight gives; the bubble is a third of
  // 1f1b's; the same parameters over the ranks; a stage boundary per chunk and direction.
  pp2.pipeline = 2;
  c.parallel.pipeline_schedule = dst::config::PipelineSchedule::interleaved;
  c.parallel.virtual_stages = 3;
  const auto inter = dst::train::make_plan(c, pp2);
  ASSERT_EQ(inter.stages.size(), 2u);
  EXPECT_EQ(inter.chunks, 3);
  using Range = std::pair<std::int64_t, std::int64_t>;
  EXPECT_EQ(inter.stages[0].chunks, (std::vector<Range>{{0, 5}, {10, 15}, {20, 25}}));
  EXPECT_EQ(inter.stages[1].chunks, (std::vector<Range>{{5, 10}, {15, 20}, {25, 30}}));
  EXPECT_TRUE(inter.stages[0].embedding);
  EXPECT_TRUE(inter.stages[1].head);
  for (int s = 0; s < 2; ++s) {
    std::int64_t records = 0;
    for (const std::int64_t n : dst::model::chunk_in_flight(2, s, 3, 8))
      records += n;
    EXPECT_EQ(inter.stages[static_cast<std::size_t>(s)].in_flight, records);
  }
  EXPECT_EQ(inter.stages[0].parameters + inter.stages[1].parameters, whole.params.total());
  EXPECT_DOUBLE_EQ(inter.bubble_fraction, 1.0 / 24.0);
  // Virtual stage v = chunk x 2 + rank sends activations to v + 1 (up to its records) and
  // gradients to v - 1 (up to v - 1's records).
  {
    const auto r0 = dst::model::chunk_in_flight(2, 0, 3, 8);
    const auto r1 = dst::model::chunk_in_flight(2, 1, 3, 8);
    // rank 0: v 0, 2, 4; rank 1: v 1, 3, 5 (the last sends no activations).
    EXPECT_EQ(inter.stages[0].sends_in_flight, r0[0] + (r0[1] + r1[0]) + (r0[2] + r1[1]));
    EXPECT_EQ(inter.stages[1].sends_in_flight, (r1[0] + r0[0]) + (r1[1] + r0[1]) + r0[2]);
  }
  // More records in flight than 1f1b's (each of 1 / 3 of the stage's blocks): more
  // activation memory on stage 0 (4 + 3 + 2 = 9 chunk records against 2 stage records).
  EXPECT_GT(inter.stages[0].memory.activations, staged.stages[0].memory.activations);
  EXPECT_LT(inter.step.compute_s, staged.step.compute_s);
  EXPECT_GT(inter.step.comm_s, staged.step.comm_s);
  EXPECT_FALSE(inter.stages[1].embedding_copy);
  EXPECT_EQ(inter.embedding_sum_bytes, 0.0);

  // Tied embeddings: the last stage holds a copy of the table (its parameters and memory)
  // and the two ends exchange its gradient once per step.
  c.parallel.pipeline_schedule = dst::config::PipelineSchedule::one_f_one_b;
  c.parallel.virtual_stages = 1;
  c.model.tie_embeddings = true;
  const auto tied = dst::train::make_plan(c, pp2);
  const std::int64_t table = c.model.vocab_size * c.model.d_model;
  ASSERT_EQ(tied.stages.size(), 2u);
  EXPECT_FALSE(tied.stages[0].embedding_copy);
  EXPECT_TRUE(tied.stages[1].embedding_copy);
  EXPECT_EQ(tied.stages[0].parameters + tied.stages[1].parameters, tied.params.total() + table);
  EXPECT_EQ(tied.stages[1].parameters, staged.stages[1].parameters);  // the copy for lm_head
  EXPECT_DOUBLE_EQ(tied.embedding_sum_bytes, static_cast<double>(table) * 4.0);
}

// Stages holding DeepSeekMoE blocks (DeepSeek-V2-Lite: 27 blocks, block 0 dense): each
// stage's memory is its own model's (the MoE blocks' host routing once per micro-batch in
// flight), expert parallelism's kept rows count the stage's MoE blocks x its records, and
// the all-to-all per rank the heaviest stage's MoE blocks.
TEST(Plan, PipelineStagesHoldMoeBlocks) {
  dst::config::RunConfig c;
  c.model = dst::config::preset_model("deepseek-v2-lite");
  c.data.seq_len = 512;
  c.training.micro_batch_size = 1;
  c.parallel.pipeline = 3;
  c.parallel.pipeline_layers = {7, 10, 10};
  dst::config::Layout pp3;
  pp3.world_size = 6;
  pp3.pipeline = 3;
  pp3.data = 2;
  pp3.expert = 2;
  pp3.global_batch_size = 8;
  pp3.grad_accum_steps = 4;
  const auto plan = dst::train::make_plan(c, pp3);
  ASSERT_EQ(plan.stages.size(), 3u);
  // Every stage holds an MoE block: each rank stores its half of the stage's routed
  // experts (26 MoE layers x 64 experts x 3 matrices of 2048 x 1408), the rest whole.
  std::int64_t parameters = 0;
  for (const auto& s : plan.stages)
    parameters += s.parameters;
  const std::int64_t routed =
      26 * c.model.n_routed_experts * 3 * c.model.d_model * c.model.moe_intermediate_size;
  EXPECT_EQ(parameters + routed / 2, plan.params.total());
  const std::int64_t T = 512, K = 6;
  const std::uint64_t kept_row = (5 * 2048 + 4 * 1408) * sizeof(float);
  const std::int64_t moe_blocks[3] = {6, 10, 10};  // block 0 is dense
  for (int s = 0; s < 3; ++s) {
    const auto& st = plan.stages[static_cast<std::size_t>(s)];
    EXPECT_EQ(st.in_flight, std::min<std::int64_t>(3 - s, 4));
    const dst::model::StageBlocks sb = dst::model::stage_blocks(c, s, st.in_flight);
    dst::model::ModelOptions o;
    o.chunks = {sb};
    o.ep = dst::model::ExpertSlice{0, 2};
    const dst::model::LanguageModel part(c.model, 1, T, dst::tensor::Arena::Mode::plan, o);
    EXPECT_EQ(part.moe_blocks(), moe_blocks[s]);
    EXPECT_EQ(st.parameters, part.params().parameter_count());
    const std::uint64_t ep =
        static_cast<std::uint64_t>(moe_blocks[s] * st.in_flight * T * K) * kept_row;
    EXPECT_EQ(st.memory.activations, part.memory().activations + ep) << "stage " << s;
  }
  // The routing records: stage 1's 10 MoE blocks keep 2 micro-batches' routing, stage 2's one.
  EXPECT_GT(plan.stages[1].memory.activations, plan.stages[2].memory.activations);
  const double rows = static_cast<double>(T * K) * 2048 * sizeof(float);
  EXPECT_DOUBLE_EQ(plan.alltoall_bytes_per_moe_layer, 4.0 * 4 * 0.5 * rows);
  const auto a2a = std::find_if(plan.collectives.begin(), plan.collectives.end(),
                                [](const auto& x) { return x.what.find("all-to-all") == 0; });
  ASSERT_NE(a2a, plan.collectives.end());
  EXPECT_NE(a2a->what.find(": 10 MoE layers x"), std::string::npos) << a2a->what;
  EXPECT_DOUBLE_EQ(a2a->bytes_per_rank, 10 * plan.alltoall_bytes_per_moe_layer);

  // Interleaved, 3 x 2 virtual stages of 4, 4, 5, 4, 5, 5 blocks: rank 0 holds blocks 0-3
  // and 13-16 (7 MoE blocks: block 0 is dense), rank 1 4-7 and 17-21 (9), rank 2 8-12 and
  // 22-26 (10). The all-to-all counts the busiest rank's own MoE layers, not the span of
  // its chunks (rank 2's [8, 27) would be 19).
  c.parallel.pipeline_layers = {4, 4, 5, 4, 5, 5};
  c.parallel.pipeline_schedule = dst::config::PipelineSchedule::interleaved;
  c.parallel.virtual_stages = 2;
  pp3.grad_accum_steps = 3;
  pp3.global_batch_size = 6;
  const auto inter = dst::train::make_plan(c, pp3);
  const auto a2a_inter = std::find_if(inter.collectives.begin(), inter.collectives.end(),
                                      [](const auto& x) { return x.what.find("all-to-all") == 0; });
  ASSERT_NE(a2a_inter, inter.collectives.end());
  EXPECT_NE(a2a_inter->what.find(": 10 MoE layers x"), std::string::npos) << a2a_inter->what;
}

TEST(Plan, ZeroStagesDivideWhatOnlyTheOptimizerStepReads) {
  dst::config::RunConfig c;
  c.model = deepseek_llm_7b();
  c.data.seq_len = 4096;
  c.training.micro_batch_size = 1;
  c.training.precision = dst::config::Precision::bf16;
  dst::config::Layout dp8;
  dp8.world_size = 8;
  dp8.data = 8;
  dp8.global_batch_size = 8;
  dp8.grad_accum_steps = 1;
  const std::uint64_t P = 4ull * 6910365696;  // one fp32 flat buffer (the tensors are aligned)
  // The run's shards (GradSync over MPI: whole tensors, ZeroShards::by_tensors): the
  // heaviest of the 8 holds at least an eighth and less than an eighth plus its largest
  // tensor (the embedding table or the head, 102400 x 4096).
  const dst::model::ParamStore store(dst::model::dense_parameter_layout(c.model),
                                     dst::tensor::Arena::Mode::plan);
  const dst::train::ZeroShards shards = dst::train::ZeroShards::by_tensors(store, 8);
  std::uint64_t S = 0;
  for (int r = 0; r < 8; ++r)
    S = std::max<std::uint64_t>(S, 4 * (shards.last(r) - shards.first(r)));
  EXPECT_GE(S, P / 8);
  EXPECT_LT(S, P / 8 + 4ull * 102400 * 4096);
  EXPECT_EQ(dst::train::largest_shard_bytes(store, 8, 1, false), S);
  // The shared-memory update's parts of the buffer: an eighth each (rounded).
  EXPECT_LE(dst::train::largest_shard_bytes(store, 8, 1, true), P / 8 + 64);
  dst::train::PlanOptions o;
  const auto z0 = dst::train::make_plan(c, dp8, o);
  o.zero_stage = 1;
  const auto z1 = dst::train::make_plan(c, dp8, o);
  o.zero_stage = 2;
  const auto z2 = dst::train::make_plan(c, dp8, o);
  EXPECT_EQ(z0.memory.optimizer, 2 * P);
  EXPECT_EQ(z1.memory.optimizer, 2 * S);
  EXPECT_EQ(z1.memory.master, S);
  EXPECT_EQ(z1.memory.gradients, P);
  // Stage 2: the shard and the bucket in flight at the end of the backward.
  const auto bucket = static_cast<std::uint64_t>(c.parallel.bucket_mb * 1024 * 1024);
  EXPECT_EQ(z2.memory.gradients, S + bucket);
  EXPECT_EQ(z2.memory.parameters, z0.memory.parameters);  // the forward reads every weight
  EXPECT_EQ(z2.memory.activations, z0.memory.activations);
  // Bytes per parameter: 2 + 4 + 12 (replicas), 2 + 4 + 12/8 (stage 1), 2 + 16/8 (stage 2,
  // and the bucket in flight), with the heaviest shard for the eighths.
  const auto model_bytes = [](const dst::train::MemoryPlan& m) {
    return m.parameters + m.master + m.gradients + m.optimizer;
  };
  EXPECT_EQ(model_bytes(z0.memory), 18 * (P / 4));
  EXPECT_EQ(model_bytes(z1.memory), P / 2 + P + 3 * S);
  EXPECT_EQ(model_bytes(z2.memory), P / 2 + 4 * S + bucket);
  // A buffer of no more than the shard and one bucket stays whole.
  dst::config::RunConfig one_bucket = c;
  one_bucket.parallel.bucket_mb = 1.0e5;
  EXPECT_EQ(dst::train::make_plan(one_bucket, dp8, o).memory.gradients, P);
  // The same bytes on the wire per rank: an all-reduce is a reduce-scatter plus an
  // all-gather, and stage 1/2 gathers the 16-bit parameters instead of fp32 gradients.
  ASSERT_EQ(z0.collectives.size(), 2u);
  EXPECT_DOUBLE_EQ(z0.collectives[0].bytes_per_rank, 2.0 * 7.0 / 8.0 * static_cast<double>(P));
  ASSERT_EQ(z1.collectives.size(), 3u);
  EXPECT_DOUBLE_EQ(z1.collectives[0].bytes_per_rank, 7.0 / 8.0 * static_cast<double>(P));
  EXPECT_DOUBLE_EQ(z1.collectives[1].bytes_per_rank, 7.0 / 8.0 * static_cast<double>(P / 2));
  // Accumulating micro-batches keeps the whole gradient buffer at stage 2.
  dst::config::Layout accum = dp8;
  accum.global_batch_size = 32;
  accum.grad_accum_steps = 4;
  EXPECT_EQ(dst::train::make_plan(c, accum, o).memory.gradients, P);
  o.zero_stage = 3;
  EXPECT_THROW(dst::train::make_plan(c, dp8, o), dst::Error);
}

TEST(Plan, RecomputeTradesActivationsForFlops) {
  dst::config::RunConfig c;
  c.model = deepseek_llm_7b();
  c.data.seq_len = 4096;
  c.training.micro_batch_size = 1;
  dst::config::Layout one;
  one.global_batch_size = 1;
  const auto none = dst::train::make_plan(c, one);
  c.training.recompute = dst::config::Recompute::selective;
  const auto selective = dst::train::make_plan(c, one);
  c.training.recompute = dst::config::Recompute::full;
  const auto full = dst::train::make_plan(c, one);
  const std::uint64_t probs = 4ull * 32 * 4096 * 4096;  // (B, H, T, T) fp32, one layer
  EXPECT_EQ(none.memory.activations - selective.memory.activations, 30 * probs);
  EXPECT_EQ(selective.memory.recompute, probs);
  EXPECT_EQ(none.memory.recompute, 0u);
  EXPECT_LT(full.memory.activations + full.memory.recompute,
            (selective.memory.activations + selective.memory.recompute) / 4);
  // Model FLOPs do not change; the executed ones grow by the recomputed forward.
  EXPECT_EQ(full.flops_per_token, none.flops_per_token);
  const double layers = static_cast<double>(dst::model::count_parameters(c.model).layers);
  EXPECT_DOUBLE_EQ(full.recompute_flops_per_token, 2 * layers + 4.0 * 30 * 4096 * 4096);
  EXPECT_DOUBLE_EQ(selective.recompute_flops_per_token, 2.0 * 30 * 4096 * 4096);
  EXPECT_GT(full.step.compute_s, none.step.compute_s * 1.25);
}

// tiny-moe (latent attention, DeepSeekMoE): the routed experts' activations are dropless,
// top_k x tokens rows in all (the balanced top_k x tokens / n_routed per expert), each row
// its sorted input, h1, h3, g and output plus its host routing (choice, weight and its
// gradient, sorted token and row) and their copies for the kernels (sorted token, row,
// weight); recompute's FLOPs use the active parameters and the
// latent attention's query/key width.
TEST(Plan, MoeActivationsGrowWithTopKAndRecomputeCountsActiveFlops) {
  auto c = dst::config::load_deck_text(
      "model: {preset: tiny-moe}\ntraining: {micro_batch_size: 2}\n", "plan_test");
  dst::config::Layout one;
  one.global_batch_size = 2;
  const auto& m = c.model;
  const std::uint64_t N = 2 * static_cast<std::uint64_t>(c.data.seq_len);
  const auto moe_layers = static_cast<std::uint64_t>(m.n_layers - m.first_k_dense_replace);
  const auto top2 = dst::train::make_plan(c, one);
  ASSERT_EQ(m.num_experts_per_tok, 2);
  c.model.num_experts_per_tok = 1;
  const auto top1 = dst::train::make_plan(c, one);
  const auto row_bytes =
      static_cast<std::uint64_t>((2 * m.d_model + 3 * m.moe_intermediate_size) * 4 + 8 * 4);
  EXPECT_EQ(top2.memory.activations - top1.memory.activations, moe_layers * N * row_bytes);
  EXPECT_EQ(top2.memory.parameters, top1.memory.parameters);  // every expert, whatever top_k

  c.model.num_experts_per_tok = 2;
  c.training.recompute = dst::config::Recompute::selective;
  const auto selective = dst::train::make_plan(c, one);
  c.training.recompute = dst::config::Recompute::full;
  const auto full = dst::train::make_plan(c, one);
  const double L = static_cast<double>(m.n_layers), T = static_cast<double>(c.data.seq_len);
  const double qk = static_cast<double>(m.n_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim));
  const double v = static_cast<double>(m.n_heads * m.v_head_dim);
  EXPECT_DOUBLE_EQ(selective.recompute_flops_per_token, 2.0 * L * T * qk);
  const auto p = dst::model::count_parameters(m);
  const double active_layers = static_cast<double>(p.per_layer * m.first_k_dense_replace +
                                                   p.per_moe_layer_active * p.moe_layers);
  EXPECT_LT(active_layers, static_cast<double>(p.layers));
  EXPECT_DOUBLE_EQ(full.recompute_flops_per_token, 2.0 * active_layers + 2.0 * L * T * (qk + v));
  EXPECT_LT(full.memory.activations + full.memory.recompute,
            selective.memory.activations + selective.memory.recompute);
}

TEST(Plan, StepTimeComesFromTheRateTable) {
  dst::config::RunConfig c;
  c.model = deepseek_llm_7b();
  c.data.seq_len = 4096;
  c.training.micro_batch_size = 1;
  c.training.precision = dst::config::Precision::bf16;
  dst::config::Layout dp64;
  dp64.world_size = 64;
  dp64.data = 64;
  dp64.global_batch_size = 64;
  dst::train::PlanOptions o;
  o.host = "h100";
  const auto p = dst::train::make_plan(c, dp64, o);
  const auto& r = dst::train::host_rates("h100");
  EXPECT_DOUBLE_EQ(p.step.compute_s, p.flops_per_token * 4096 / (r.gemm_16bit_gflops * 1e9));
  // 64 ranks span 8 nodes: the ring runs at the network's rate.
  EXPECT_DOUBLE_EQ(p.step.comm_s, p.comm_bytes_per_step / (r.inter_node_gbs * 1e9));
  EXPECT_THROW(dst::train::host_rates("tpu"), dst::Error);
  for (const auto& row : dst::train::rate_table())
    EXPECT_FALSE(row.source.empty()) << row.kind;
}

}  // namespace
// Expert parallelism: each MoE layer's token rows (micro x T x top_k x d_model fp32) go out
// and back, forward and backward, (X-1)/X of them to other ranks; none without it.
TEST(Plan, ExpertParallelismPlansTheAllToAllPerMoeLayer) {
  const dst::config::RunConfig c = dst::config::load_deck_text(
      "model: {preset: tiny-moe}\ndata: {seq_len: 64}\n"
      "training: {micro_batch_size: 2, global_batch_size: 16}\nparallel: {expert: 4}\n",
      "plan_test");
  const dst::config::Layout four = dst::config::resolve_layout(c, 4);  // accumulation 2
  ASSERT_EQ(four.grad_accum_steps, 2);
  const auto p = dst::train::make_plan(c, four);
  const double rows = 2.0 * 64 * static_cast<double>(c.model.num_experts_per_tok);
  const double per_layer = 4.0 * 2 * 0.75 * rows * static_cast<double>(c.model.d_model) * 4;
  EXPECT_DOUBLE_EQ(p.alltoall_bytes_per_moe_layer, per_layer);
  const auto blocks = static_cast<double>(c.model.n_layers - c.model.first_k_dense_replace);
  ASSERT_FALSE(p.collectives.empty());
  EXPECT_EQ(p.collectives.back().what.rfind("all-to-all-v", 0), 0u);
  EXPECT_DOUBLE_EQ(p.collectives.back().bytes_per_rank, blocks * per_layer);
  dst::config::RunConfig plain = c;
  plain.parallel.expert = 1;
  const auto q = dst::train::make_plan(plain, dst::config::resolve_layout(plain, 4));
  EXPECT_EQ(q.alltoall_bytes_per_moe_layer, 0.0);
  // Each rank holds a quarter of the routed experts (layers/moe_dispatch.hpp): 3/4 of them
  // less in the parameters, gradients and both moments; its experts' gradients are summed
  // over the expert-data group (4 / 4 = 1 rank: nothing sent), the rest over the 4 data
  // ranks (2 x 3/4 of it sent).
  const auto& m = c.model;
  const double routed =
      blocks * static_cast<double>(m.n_routed_experts * 3 * m.d_model * m.moe_intermediate_size) *
      4.0;
  EXPECT_NEAR(static_cast<double>(q.memory.parameters - p.memory.parameters), 0.75 * routed, 64.0);
  EXPECT_NEAR(static_cast<double>(q.memory.gradients - p.memory.gradients), 0.75 * routed, 64.0);
  EXPECT_NEAR(static_cast<double>(q.memory.optimizer - p.memory.optimizer), 1.5 * routed, 128.0);
  EXPECT_NEAR(p.comm_bytes_per_step - q.comm_bytes_per_step,
              blocks * per_layer - 2.0 * 0.75 * routed, 128.0);
  // ZeRO keeps per-rank experts (the parameters those of stage 0 at the same layout) and
  // shards their moments over the expert-data ranks, the rest over the data ranks.
  dst::train::PlanOptions zero;
  zero.zero_stage = 1;
  const dst::train::Plan z = dst::train::make_plan(c, four, zero);
  const dst::train::Plan z0 = dst::train::make_plan(c, four, dst::train::PlanOptions{});
  EXPECT_EQ(z.memory.parameters, z0.memory.parameters);
  EXPECT_LT(z.memory.optimizer, z0.memory.optimizer);
}

// Node-limited routing: the bound on a token's nodes, min(M, top-k, nodes), and the
// cross-node bytes per MoE layer: every row sent, (n-1)/n of them across nodes at balanced
// load, against M copies of a token for a dispatch that sends a token once per node. The
// capacity: ceil(f x micro x T x top-k / E) rows per expert.
TEST(Plan, NodeLimitedRoutingAndCapacity) {
  const dst::config::RunConfig c = dst::config::load_deck_text(
      "model: {preset: tiny-moe, moe: {max_nodes_per_token: 1, capacity_factor: 1.25}}\n"
      "data: {seq_len: 64}\ntraining: {micro_batch_size: 2, global_batch_size: 16}\n"
      "parallel: {expert: 4}\ndebug: {expert_nodes: 2}\n",
      "plan_test");
  const dst::config::Layout four = dst::config::resolve_layout(c, 4);  // accumulation 2
  const auto p = dst::train::make_plan(c, four);
  EXPECT_EQ(p.expert_capacity, 40);  // ceil(1.25 x 128 x 2 / 8)
  EXPECT_EQ(p.expert_nodes, 2);
  EXPECT_EQ(p.token_nodes, 1);
  const double row = static_cast<double>(c.model.d_model) * 4, tokens = 2.0 * 64;
  EXPECT_DOUBLE_EQ(p.cross_node_bytes_per_moe_layer, 4.0 * 2 * tokens * 2 * 0.5 * row);
  EXPECT_DOUBLE_EQ(p.cross_node_dedup_bound_per_moe_layer, 4.0 * 2 * tokens * 1 * row);
  // The host kind's ranks per node (cpu: one VM): 4 expert ranks on one node, no
  // cross-node traffic; dropless and no limit: nothing planned.
  dst::config::RunConfig hosts = c;
  hosts.debug.expert_nodes = 0;
  dst::train::PlanOptions h100;
  h100.host = "h100";  // 8 ranks a node
  const auto q = dst::train::make_plan(hosts, four, h100);
  EXPECT_EQ(q.expert_nodes, 1);
  EXPECT_EQ(q.token_nodes, 1);
  EXPECT_EQ(q.cross_node_bytes_per_moe_layer, 0.0);
  dst::config::RunConfig plain = c;
  plain.model.moe = dst::config::MoeSection{};
  plain.debug.expert_nodes = 0;
  const auto r = dst::train::make_plan(plain, four);
  EXPECT_EQ(r.expert_capacity, -1);
  EXPECT_EQ(r.token_nodes, 0);
}
