// The model's layers as units: the parameter specs each layer kind declares (names,
// order, tensor-parallel split), and the block-range API a pipeline stage will use.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config/deck.hpp"
#include "core/error.hpp"
#include "model/language_model.hpp"
#include "model/pipeline_schedule.hpp"
#include "model/transformer.hpp"

namespace {

using dst::model::LanguageModel;
using dst::model::MicroBatchResult;
using dst::tensor::Arena;
using dst::tensor::Tensor;

dst::config::ModelSection three_blocks() {
  dst::config::ModelSection m;
  m.preset = "test";
  m.vocab_size = 13;
  m.d_model = 8;
  m.n_layers = 3;
  m.n_heads = 2;
  m.n_kv_heads = 1;
  m.ffn_dim = 12;
  m.max_seq_len = 8;
  return m;
}

/// Block `block` alone as a pipeline stage's (or chunk's) blocks.
dst::model::StageBlocks one_block(std::int64_t block, bool embedding, bool head,
                                  std::int64_t slots) {
  dst::model::StageBlocks sb;
  sb.first = block;
  sb.last = block + 1;
  sb.embedding = embedding;
  sb.head = head;
  sb.slots = slots;
  return sb;
}

/// A model's options holding `chunks` of blocks (a stage's, or several under interleaving).
dst::model::ModelOptions holding(std::vector<dst::model::StageBlocks> chunks) {
  dst::model::ModelOptions o;
  o.chunks = std::move(chunks);
  return o;
}

std::string splits(const std::vector<dst::model::ParamSpec>& specs) {
  std::string s;
  for (const auto& p : specs)
    s += p.name + " " + std::string(dst::model::split_name(p.split)) + "\n";
  return s;
}

TEST(Transformer, EachLayerDeclaresItsParametersWithTheirTensorParallelSplit) {
  auto m = three_blocks();
  m.n_layers = 1;
  EXPECT_EQ(splits(dst::model::dense_parameter_layout(m)),
            "model.embed_tokens.weight vocab\n"
            "model.layers.0.input_layernorm.weight replicated\n"
            "model.layers.0.self_attn.q_proj.weight column\n"
            "model.layers.0.self_attn.k_proj.weight column\n"
            "model.layers.0.self_attn.v_proj.weight column\n"
            "model.layers.0.self_attn.o_proj.weight row\n"
            "model.layers.0.post_attention_layernorm.weight replicated\n"
            "model.layers.0.mlp.gate_proj.weight column\n"
            "model.layers.0.mlp.up_proj.weight column\n"
            "model.layers.0.mlp.down_proj.weight row\n"
            "model.norm.weight replicated\n"
            "lm_head.weight vocab\n");
  m.tie_embeddings = true;  // the head reads the embedding's table: no lm_head
  const auto tied = dst::model::dense_parameter_layout(m);
  EXPECT_EQ(tied.back().name, "model.norm.weight");
  EXPECT_EQ(tied.size(), 11u);
}

/// Builds the layout of each of `T` tensor ranks of `m`, initialises it, and checks that each
/// slice holds exactly its part of the whole tensor (the generator draws logical indices)
/// and that the slices of each tensor's first holders put back give the whole; `check`
/// sees each (slice spec, whole spec, rank) first.
void expect_slices_are_the_whole_tensors_parts(
    const dst::config::ModelSection& m, int T,
    const std::function<void(const dst::model::ParamSpec&, const dst::model::ParamSpec&, int)>&
        check) {
  using dst::model::ParamStore;
  ParamStore whole(dst::model::dense_parameter_layout(m), Arena::Mode::allocate);
  whole.initialize(7);
  std::vector<std::vector<float>> rebuilt(whole.size());
  for (std::size_t i = 0; i < whole.size(); ++i)
    rebuilt[i].assign(static_cast<std::size_t>(whole.spec(i).shape.numel()), -1.0f);
  for (int r = 0; r < T; ++r) {
    const dst::model::Transformer net(m, {r, T});
    ParamStore part(net.parameter_layout(), Arena::Mode::allocate);
    part.initialize(7);
    ASSERT_EQ(part.size(), whole.size());
    for (std::size_t i = 0; i < part.size(); ++i) {
      const auto& s = part.spec(i);
      const auto& w = whole.spec(i);
      ASSERT_EQ(s.name, w.name);
      EXPECT_EQ(dst::model::logical_shape(s), w.shape) << s.name;
      check(s, w, r);
      const auto n = static_cast<std::size_t>(s.shape.numel());
      std::vector<float> expected(n);
      dst::model::copy_slice_from_whole(s, whole.param(i).ptr<float>(), expected.data());
      EXPECT_EQ(std::memcmp(expected.data(), part.param(i).ptr<float>(), n * sizeof(float)), 0)
          << s.name << " slice " << r;
      if (r % s.tp_replicas == 0)
        dst::model::copy_slice_to_whole(s, part.param(i).ptr<float>(), rebuilt[i].data());
    }
  }
  for (std::size_t i = 0; i < whole.size(); ++i)
    EXPECT_EQ(std::memcmp(rebuilt[i].data(), whole.param(i).ptr<float>(),
                          rebuilt[i].size() * sizeof(float)),
              0)
        << whole.spec(i).name;
}

// Tensor parallelism: each rank's layout holds its slices (column and vocab split by rows,
// row by columns, norms whole), each its part of the whole tensor.
TEST(Transformer, TensorParallelSlicesAreTheWholeTensorsParts) {
  auto m = three_blocks();
  m.n_kv_heads = 2;  // T = 2 divides the kv heads: no replication
  m.vocab_size = 14;
  expect_slices_are_the_whole_tensors_parts(
      m, 2, [](const dst::model::ParamSpec& s, const dst::model::ParamSpec& w, int r) {
        EXPECT_EQ(s.tp_replicas, 1) << s.name;
        if (s.split == dst::model::Split::replicated) {
          EXPECT_EQ(s.shape, w.shape) << s.name;
          EXPECT_EQ(s.tp_size, 1) << s.name;
        } else {
          EXPECT_EQ(s.tp_size, 2) << s.name;
          EXPECT_EQ(s.tp_rank, r) << s.name;
          const int dim = s.split == dst::model::Split::row ? 1 : 0;
          EXPECT_EQ(s.shape[dim] * 2, w.shape[dim]) << s.name;
        }
      });
  // o_proj (8, 8) split by columns: slice 1's element (row 2, column 1) is the whole's
  // (2, 4 + 1).
  const dst::model::Transformer net(m, {1, 2});
  const auto specs = net.parameter_layout();
  for (const auto& s : specs)
    if (s.name == "model.layers.0.self_attn.o_proj.weight") {
      EXPECT_EQ(s.shape, (dst::tensor::Shape{8, 4}));
      EXPECT_EQ(dst::model::logical_index(s, 2 * 4 + 1), 2u * 8u + 5u);
    }
  EXPECT_THROW(dst::model::Transformer(m, {2, 2}).parameter_layout(), dst::Error);
}

// Fewer key/value heads than tensor ranks (Megatron-LM's replication): 4 query heads, 2
// key/value heads over T = 4. Rank r holds query head r and key/value head r / 2 (its
// k_proj, v_proj rows: slice r / 2 of 2, shared by ranks 2 (r / 2) and 2 (r / 2) + 1), each
// slice initialises to exactly its part of the whole tensor, and the shared slices of the
// first rank of each pair put back give the whole.
TEST(Transformer, ReplicatedKeyValueSlicesAreTheWholeTensorsParts) {
  auto m = three_blocks();
  m.n_heads = 4;
  m.n_kv_heads = 2;
  m.vocab_size = 16;
  int shared = 0;
  expect_slices_are_the_whole_tensors_parts(
      m, 4, [&shared](const dst::model::ParamSpec& s, const dst::model::ParamSpec&, int r) {
        const bool kv = s.name.find("k_proj") != std::string::npos ||
                        s.name.find("v_proj") != std::string::npos;
        if (kv) {
          ++shared;
          EXPECT_EQ(s.tp_replicas, 2) << s.name;
          EXPECT_EQ(s.tp_size, 2) << s.name;
          EXPECT_EQ(s.tp_rank, r / 2) << s.name;
          EXPECT_EQ(s.shape, (dst::tensor::Shape{2, 8})) << s.name;  // one head of dim 2
        } else {
          EXPECT_EQ(s.tp_replicas, 1) << s.name;
          EXPECT_EQ(s.tp_size, s.split == dst::model::Split::replicated ? 1 : 4) << s.name;
        }
      });
  EXPECT_EQ(shared, 4 * 2 * 3);  // every rank's k_proj and v_proj in each of 3 blocks
  // Key/value heads that neither split nor replicate evenly (6 over 4 ranks) are refused.
  m.n_heads = 12;
  m.n_kv_heads = 6;
  m.d_model = 24;
  EXPECT_THROW(dst::model::Transformer(m, {0, 4}), dst::Error);
}

/// Every buffer of a two-stage run over `net`: blocks [0, cut) and [cut, L).
struct Buffers {
  Tensor tokens, targets;
  std::vector<dst::model::BlockActs> blocks;
  dst::model::HeadActs head;
  dst::model::Rope rope;
  Tensor d_x;
  dst::model::BlockScratch scratch;

  void take(Arena& a, const dst::model::Transformer& net, std::int64_t B, std::int64_t T) {
    tokens = a.take("tokens", {B * T}, dst::DType::i32);
    targets = a.take("targets", {B * T}, dst::DType::i32);
    blocks.clear();
    for (std::int64_t l = 0; l < net.n_blocks(); ++l)
      blocks.push_back(net.block(l).take(a, B, T, false));
    head = net.head().take(a, B * T);
    rope = dst::model::Rope::take(a, T, net.block(0).head_dim());
    d_x = a.take("d_x", {B * T, head.x.shape[1]}, dst::DType::f32);
    scratch = net.block(0).take_scratch(a, B, T, false);
  }
};

// Expert parallelism's storage (layers/moe_dispatch.hpp): expert slot p of X holds, in
// each MoE layer, exactly the routed experts [p L, (p+1) L) (L = n_routed_experts / X)
// under their global names, marked ep_size X and laid out after every other tensor; the
// other tensors are the whole model's, in its order; the slots together hold every expert
// once, and each initialises to the whole model's bits (drawn by name and element). The MTP
// module's DeepSeekMoE block (model.layers.<n_layers>) likewise.
class ExpertSlots : public ::testing::TestWithParam<std::int64_t> {};

TEST_P(ExpertSlots, HoldTheirOwnExpertsLast) {
  using dst::model::ParamStore;
  auto m = dst::config::preset_model("tiny-moe");
  // tiny-moe's layout at small widths: the test draws the whole model 7 times, about 20 s
  // at tiny-moe's own widths under AddressSanitizer.
  m.d_model = 32;
  m.ffn_dim = 32;
  m.moe_intermediate_size = 16;
  m.kv_lora_rank = 16;
  m.qk_nope_head_dim = 8;
  m.qk_rope_head_dim = 8;
  m.v_head_dim = 8;
  m.mtp_depth = GetParam();
  const std::int64_t blocks = m.n_layers + m.mtp_depth;
  ASSERT_TRUE(m.mtp_depth == 0 || m.moe_layer(m.n_layers));
  ParamStore whole(dst::model::dense_parameter_layout(m), Arena::Mode::allocate);
  whole.initialize(11);
  const std::string tag = ".mlp.experts.";
  std::vector<std::string> replicated, experts;
  for (const auto& s : whole.specs())
    (s.name.find(tag) == std::string::npos ? replicated : experts).push_back(s.name);
  const std::int64_t moe_layers = blocks - m.first_k_dense_replace;
  ASSERT_EQ(static_cast<std::int64_t>(experts.size()), moe_layers * m.n_routed_experts * 3);
  for (const int X : {2, 4}) {
    const std::int64_t L = m.n_routed_experts / X;
    std::vector<std::string> held;
    for (int p = 0; p < X; ++p) {
      const dst::model::Transformer net(m, {}, {p, X});
      ParamStore part(net.parameter_layout(), Arena::Mode::allocate);
      part.initialize(11);
      std::vector<std::string> own_replicated;
      std::size_t first_expert = part.size();
      std::vector<std::int64_t> per_layer(static_cast<std::size_t>(blocks), 0);
      for (std::size_t i = 0; i < part.size(); ++i) {
        const auto& s = part.spec(i);
        const auto at = s.name.find(tag);
        if (at == std::string::npos) {
          EXPECT_EQ(s.ep_size, 1) << s.name;
          EXPECT_EQ(first_expert, part.size()) << s.name << " after an expert (slot " << p << ")";
          own_replicated.push_back(s.name);
        } else {
          first_expert = std::min(first_expert, i);
          EXPECT_EQ(s.ep_size, X) << s.name;
          const std::int64_t e = std::stoll(s.name.substr(at + tag.size()));
          EXPECT_GE(e, p * L) << s.name << " slot " << p << " of " << X;
          EXPECT_LT(e, (p + 1) * L) << s.name << " slot " << p << " of " << X;
          ++per_layer[static_cast<std::size_t>(std::stoll(s.name.substr(13)))];
          held.push_back(s.name);
        }
        const auto& w = whole.spec(whole.index_of(s.name));
        ASSERT_EQ(s.shape, w.shape) << s.name;
        EXPECT_EQ(std::memcmp(part.param(i).ptr<float>(),
                              whole.param(whole.index_of(s.name)).ptr<float>(),
                              static_cast<std::size_t>(s.shape.numel()) * sizeof(float)),
                  0)
            << s.name << " slot " << p << " of " << X;
      }
      EXPECT_EQ(own_replicated, replicated) << "slot " << p << " of " << X;
      for (std::int64_t l = 0; l < blocks; ++l)
        EXPECT_EQ(per_layer[static_cast<std::size_t>(l)], m.moe_layer(l) ? 3 * L : 0)
            << "layer " << l << " slot " << p << " of " << X;
      EXPECT_LT(part.parameter_count(), whole.parameter_count());
    }
    std::sort(held.begin(), held.end());
    std::vector<std::string> all = experts;
    std::sort(all.begin(), all.end());
    EXPECT_EQ(held, all) << X << " slots";
  }
  // A slot the experts do not divide into is refused.
  EXPECT_THROW(dst::model::Transformer(m, {}, {0, 3}), dst::Error);
}

INSTANTIATE_TEST_SUITE_P(Transformer, ExpertSlots, ::testing::Values(0, 1), [](const auto& slot) {
  return slot.param == 0 ? std::string("Model") : std::string("ModelAndMtpModule");
});

TEST(Transformer, TwoBlockRangesGiveTheWholeModelsLogitsAndGradients) {
  const auto m = three_blocks();
  const std::int64_t B = 2, T = 5, N = B * T, cut = 1;
  LanguageModel model(m, B, T, Arena::Mode::allocate);
  model.params().initialize(3);
  std::vector<std::int32_t> tokens, targets;
  for (std::int64_t i = 0; i < N; ++i) {
    tokens.push_back(static_cast<std::int32_t>((7 * i + 2) % m.vocab_size));
    targets.push_back(i == 4 ? dst::model::kIgnoreIndex
                             : static_cast<std::int32_t>((5 * i + 1) % m.vocab_size));
  }
  model.params().zero_grads();
  const double loss = model.forward_backward(tokens.data(), targets.data(), 0.5f).loss_sum;
  const auto elements = model.params().buffer_elements();
  const std::vector<float> grads(model.params().grads_data(),
                                 model.params().grads_data() + elements);
  const Tensor want_dlogits = model.logits();

  // The same layers as two pipeline stages over buffers of their own.
  dst::model::Transformer net(m);
  net.bind(model.params());
  dst::model::Compute c;
  c.params = &model.params();
  Buffers b;
  Arena plan("test", Arena::Mode::plan);
  b.take(plan, net, B, T);
  Arena arena("test", Arena::Mode::allocate, plan.used_bytes());
  b.take(arena, net, B, T);
  b.rope.fill(c.ctx, m.rope_theta);
  std::memcpy(b.tokens.data, tokens.data(), tokens.size() * sizeof(std::int32_t));
  std::memcpy(b.targets.data, targets.data(), targets.size() * sizeof(std::int32_t));
  model.params().zero_grads();
  net.embedding().forward(c, b.tokens, b.blocks[0].x);
  net.forward_blocks(c, b.rope, B, T, b.blocks, 0, cut, b.blocks[cut].x);
  net.forward_blocks(c, b.rope, B, T, b.blocks, cut, m.n_layers, b.head.x);
  net.head().forward(c, b.head.x, b.head.norm, b.head.logits);
  net.head().loss_and_gradient(c, b.head, b.targets, 0.5f);
  std::vector<std::size_t> ready;
  const dst::model::OnReady on_ready = [&](std::size_t offset) { ready.push_back(offset); };
  net.head().backward(c, b.head, b.scratch.d_ln, b.d_x, on_ready);
  net.backward_blocks(c, b.rope, B, T, b.blocks, b.scratch, cut, m.n_layers, b.d_x, on_ready);
  net.backward_blocks(c, b.rope, B, T, b.blocks, b.scratch, 0, cut, b.d_x, on_ready);
  net.embedding().backward(c, b.tokens, b.d_x);

  double sum = 0.0;
  for (std::int64_t i = 0; i < N; ++i)
    if (targets[static_cast<std::size_t>(i)] != dst::model::kIgnoreIndex)
      sum += static_cast<double>(b.head.losses.ptr<float>()[i]);
  EXPECT_EQ(sum, loss);
  EXPECT_EQ(std::memcmp(b.head.logits.data, want_dlogits.data, N * m.vocab_size * sizeof(float)),
            0);
  EXPECT_EQ(std::memcmp(model.params().grads_data(), grads.data(), elements * sizeof(float)), 0);
  // The head, then each block twice (mid-block and whole), last block first.
  ASSERT_EQ(ready.size(), 1u + 2u * static_cast<std::size_t>(m.n_layers));
  EXPECT_EQ(
      ready.back(),
      model.params().spec(model.params().index_of("model.layers.0.input_layernorm.weight")).offset);

  EXPECT_THROW(net.forward_blocks(c, b.rope, B, T, b.blocks, 2, 4, b.head.x), dst::Error);
  EXPECT_THROW(net.backward_blocks(c, b.rope, B, T, b.blocks, b.scratch, 2, 1, b.d_x, on_ready),
               dst::Error);
}

}  // namespace

namespace {

// Pipeline stages as LanguageModels (model/stage.hpp): three stages of blocks {0}, {1}, {2},
// each holding only its layers, run micro-batch by micro-batch with the activations and
// their gradients copied between them as the trainer sends them, give the whole model's
// loss and gradients bit for bit (the same operations on the same inputs). The middle
// stage keeps two records, used alternately, as 1F1B keeps two micro-batches in flight.
TEST(PipelineStages, ThreeStagesGiveTheWholeModelsLossAndGradients) {
  const auto m = three_blocks();
  const std::int64_t B = 2, T = 4, N = B * T;
  LanguageModel whole(m, B, T, Arena::Mode::allocate);
  whole.params().initialize(7);
  whole.refresh_compute_params();
  std::vector<std::unique_ptr<LanguageModel>> stages;
  for (int s = 0; s < 3; ++s) {
    stages.push_back(std::make_unique<LanguageModel>(
        m, B, T, Arena::Mode::allocate, holding({one_block(s, s == 0, s == 2, s == 1 ? 2 : 1)})));
    stages.back()->params().initialize(7);
    stages.back()->refresh_compute_params();
  }
  // Each stage holds its layers' parameters only.
  EXPECT_EQ(stages[0]->params().spec(0).name, "model.embed_tokens.weight");
  EXPECT_EQ(stages[1]->params().spec(0).name, "model.layers.1.input_layernorm.weight");
  EXPECT_EQ(stages[2]->params().specs().back().name, "lm_head.weight");
  EXPECT_EQ(stages[0]->params().parameter_count() + stages[1]->params().parameter_count() +
                stages[2]->params().parameter_count(),
            whole.params().parameter_count());
  EXPECT_THROW(stages[1]->params().index_of("model.embed_tokens.weight"), dst::Error);

  const auto copy = [](const Tensor& from, const Tensor& to) {
    std::memcpy(to.data, from.data, static_cast<std::size_t>(from.numel()) * sizeof(float));
  };
  whole.params().zero_grads();
  for (auto& s : stages)
    s->params().zero_grads();
  double whole_loss = 0.0, staged_loss = 0.0;
  for (int micro = 0; micro < 2; ++micro) {
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(N)), targets(tokens.size());
    for (std::int64_t i = 0; i < N; ++i) {
      tokens[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((i * 5 + micro * 3) % 13);
      targets[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((i * 7 + micro) % 13);
    }
    whole_loss += whole.forward_backward(tokens.data(), targets.data(), 0.25f).loss_sum;
    const auto slot = static_cast<std::size_t>(micro);
    stages[0]->stage_forward(0, tokens.data(), targets.data(), 0.25f, true);
    copy(stages[0]->stage_output(0), stages[1]->stage_input(slot));
    stages[1]->stage_forward(slot, tokens.data(), targets.data(), 0.25f, true);
    copy(stages[1]->stage_output(slot), stages[2]->stage_input(0));
    const MicroBatchResult last =
        stages[2]->stage_forward(0, tokens.data(), targets.data(), 0.25f, true);
    staged_loss += last.loss_sum;
    EXPECT_EQ(last.valid_tokens, N);
    stages[2]->stage_backward(0);
    copy(stages[2]->stage_gradient(), stages[1]->stage_gradient());
    stages[1]->stage_backward(slot);
    copy(stages[1]->stage_gradient(), stages[0]->stage_gradient());
    stages[0]->stage_backward(0);
  }
  EXPECT_EQ(staged_loss, whole_loss);
  for (const auto& s : stages)
    for (const auto& spec : s->params().specs()) {
      const Tensor a = s->params().grad(spec.name), b = whole.params().grad(spec.name);
      ASSERT_EQ(a.numel(), b.numel()) << spec.name;
      EXPECT_EQ(std::memcmp(a.data, b.data, static_cast<std::size_t>(a.numel()) * sizeof(float)), 0)
          << spec.name;
    }
}

// The same with latent attention and DeepSeekMoE blocks (block 0 dense, 1-2 MoE with a
// sigmoid router, its correction bias and the balance loss), in 1F1B's order for three
// stages and two micro-batches: stages 0 and 1 hold both micro-batches at once (two
// records each), so a routing shared between records would give stage 1's first backward
// the second micro-batch's choices. Losses, balance losses, gradients (the balance loss's
// included) and the expert loads (summed over the records) are the whole model's bit for bit.
TEST(PipelineStages, MoeStagesInOneFOneBOrderGiveTheWholeModels) {
  auto m = three_blocks();
  m.n_kv_heads = 2;
  m.kv_lora_rank = 8;
  m.qk_nope_head_dim = 4;
  m.qk_rope_head_dim = 4;
  m.v_head_dim = 4;
  m.n_routed_experts = 4;
  m.n_shared_experts = 1;
  m.num_experts_per_tok = 2;
  m.moe_intermediate_size = 6;
  m.first_k_dense_replace = 1;
  m.moe.score = dst::config::MoeScore::sigmoid;
  m.moe.seq_aux_loss_alpha = 0.1;
  const std::int64_t B = 2, T = 4, N = B * T;
  LanguageModel whole(m, B, T, Arena::Mode::allocate);
  whole.params().initialize(7);
  whole.refresh_compute_params();
  std::vector<std::unique_ptr<LanguageModel>> st;
  for (int s = 0; s < 3; ++s) {
    st.push_back(std::make_unique<LanguageModel>(
        m, B, T, Arena::Mode::allocate, holding({one_block(s, s == 0, s == 2, s == 2 ? 1 : 2)})));
    st.back()->params().initialize(7);
    st.back()->refresh_compute_params();
    st.back()->params().zero_grads();
  }
  EXPECT_EQ(st[0]->moe_blocks(), 0);
  EXPECT_EQ(st[1]->moe_blocks(), 1);
  EXPECT_EQ(st[2]->moe_blocks(), 1);
  EXPECT_EQ(whole.moe_blocks(), 2);

  std::vector<std::vector<std::int32_t>> tokens(2), targets(2);
  for (int micro = 0; micro < 2; ++micro)
    for (std::int64_t i = 0; i < N; ++i) {
      tokens[micro].push_back(static_cast<std::int32_t>((i * 5 + micro * 3) % 13));
      targets[micro].push_back(static_cast<std::int32_t>((i * 7 + micro) % 13));
    }
  whole.params().zero_grads();
  double whole_loss = 0.0, whole_aux = 0.0;
  for (int micro = 0; micro < 2; ++micro) {
    const MicroBatchResult r =
        whole.forward_backward(tokens[micro].data(), targets[micro].data(), 0.25f);
    whole_loss += r.loss_sum;
    whole_aux += r.aux_loss();
  }
  ASSERT_GT(whole_aux, 0.0);

  const auto copy = [](const Tensor& from, const Tensor& to) {
    std::memcpy(to.data, from.data, static_cast<std::size_t>(from.numel()) * sizeof(float));
  };
  double loss = 0.0;
  std::vector<double> aux(2, 0.0);  // per micro-batch: block 1's term, then block 2's
  const auto forward = [&](int s, int micro) {
    const auto slot = static_cast<std::size_t>(s == 2 ? 0 : micro);
    if (s > 0)
      copy(st[s - 1]->stage_output(static_cast<std::size_t>(micro)), st[s]->stage_input(slot));
    const MicroBatchResult r =
        st[s]->stage_forward(slot, tokens[micro].data(), targets[micro].data(), 0.25f, true);
    loss += r.loss_sum;
    for (const double a : r.aux_losses)
      aux[static_cast<std::size_t>(micro)] += a;
  };
  const auto backward = [&](int s, int micro) {
    if (s < 2) copy(st[s + 1]->stage_gradient(), st[s]->stage_gradient());
    st[s]->stage_backward(static_cast<std::size_t>(s == 2 ? 0 : micro));
  };
  // 1F1B (model/pipeline_schedule): stage 0 F0 F1 B0 B1, stage 1 F0 F1 B0 B1, stage 2 F0
  // B0 F1 B1; interleaved as the messages allow.
  forward(0, 0);
  forward(0, 1);
  forward(1, 0);
  forward(2, 0);
  backward(2, 0);
  forward(1, 1);  // stage 1 now holds micro-batch 1's routing beside micro-batch 0's
  backward(1, 0);
  backward(0, 0);
  forward(2, 1);
  backward(2, 1);
  backward(1, 1);
  backward(0, 1);
  EXPECT_EQ(loss, whole_loss);
  EXPECT_EQ(aux[0] + aux[1], whole_aux);
  std::vector<double> loads = st[1]->moe_loads();
  const std::vector<double> last = st[2]->moe_loads();
  loads.insert(loads.end(), last.begin(), last.end());
  EXPECT_EQ(loads, whole.moe_loads());
  for (const auto& s : st)
    for (const auto& spec : s->params().specs()) {
      const Tensor a = s->params().grad(spec.name), b = whole.params().grad(spec.name);
      ASSERT_EQ(a.numel(), b.numel()) << spec.name;
      EXPECT_EQ(std::memcmp(a.data, b.data, static_cast<std::size_t>(a.numel()) * sizeof(float)), 0)
          << spec.name;
    }
  // Each stage moves its own block's bias from its own loads, as the whole model does.
  whole.update_moe_bias(whole.moe_loads(), 0.5);
  st[1]->update_moe_bias(st[1]->moe_loads(), 0.5);
  st[2]->update_moe_bias(st[2]->moe_loads(), 0.5);
  std::vector<float> bias = st[1]->moe_bias();
  const std::vector<float> bias2 = st[2]->moe_bias();
  bias.insert(bias.end(), bias2.begin(), bias2.end());
  EXPECT_EQ(bias, whole.moe_bias());
  st[1]->reset_moe_loads();
  EXPECT_EQ(st[1]->moe_loads(), std::vector<double>(4, 0.0));
}

// The interleaved schedule's chunks (model/stage.hpp rank_chunks): "rank 0" holds blocks
// {0} (with the embedding) and {2} (with the head), "rank 1" block {1}; rank 0's first
// chunk keeps two records, as when both micro-batches are in flight before their backward.
// Its parameters are in the model's order, and the micro-batches run through the chunks
// in an interleaved order give the whole model's loss and gradients bit for bit.
TEST(PipelineStages, InterleavedChunksGiveTheWholeModelsLossAndGradients) {
  const auto m = three_blocks();
  const std::int64_t B = 2, T = 4, N = B * T;
  LanguageModel whole(m, B, T, Arena::Mode::allocate);
  whole.params().initialize(7);
  whole.refresh_compute_params();
  const auto chunk = one_block;
  const auto make = [&](const std::vector<dst::model::StageBlocks>& chunks) {
    auto d = std::make_unique<LanguageModel>(m, B, T, Arena::Mode::allocate, holding(chunks));
    d->params().initialize(7);
    d->refresh_compute_params();
    return d;
  };
  const auto r0 = make({chunk(0, true, false, 2), chunk(2, false, true, 1)});
  const auto r1 = make({chunk(1, false, false, 2)});
  std::vector<std::string> names;
  for (const auto& spec : r0->params().specs())
    names.push_back(spec.name);
  EXPECT_EQ(names.front(), "model.embed_tokens.weight");
  EXPECT_EQ(names[1], "model.layers.0.input_layernorm.weight");
  EXPECT_EQ(names[1 + 9], "model.layers.2.input_layernorm.weight");
  EXPECT_EQ(names.back(), "lm_head.weight");
  EXPECT_EQ(r0->params().parameter_count() + r1->params().parameter_count(),
            whole.params().parameter_count());
  EXPECT_EQ(r0->record(0, 0), 0u);
  EXPECT_EQ(r0->record(0, 1), 1u);
  EXPECT_EQ(r0->record(0, 2), 0u);
  EXPECT_EQ(r0->record(1, 1), 2u);  // chunk 1's single record follows chunk 0's two
  EXPECT_THROW(r0->record(2, 0), dst::Error);
  // Chunks out of order, or the head before the last chunk, are refused.
  EXPECT_THROW(make({chunk(2, false, false, 1), chunk(0, true, false, 1)}), dst::Error);
  EXPECT_THROW(make({chunk(0, true, true, 1), chunk(2, false, false, 1)}), dst::Error);

  const auto copy = [](const Tensor& from, const Tensor& to) {
    std::memcpy(to.data, from.data, static_cast<std::size_t>(from.numel()) * sizeof(float));
  };
  whole.params().zero_grads();
  r0->params().zero_grads();
  r1->params().zero_grads();
  std::vector<std::vector<std::int32_t>> tokens(2), targets(2);
  double whole_loss = 0.0, staged_loss = 0.0;
  for (std::size_t micro = 0; micro < 2; ++micro) {
    for (std::int64_t i = 0; i < N; ++i) {
      const auto k = static_cast<std::int64_t>(micro);
      tokens[micro].push_back(static_cast<std::int32_t>((i * 5 + k * 3) % 13));
      targets[micro].push_back(static_cast<std::int32_t>((i * 7 + k) % 13));
    }
    whole_loss +=
        whole.forward_backward(tokens[micro].data(), targets[micro].data(), 0.25f).loss_sum;
  }
  // Both micro-batches through chunk 0 and rank 1, then each through the head chunk and
  // back, the backwards in micro-batch order per chunk.
  for (std::size_t micro = 0; micro < 2; ++micro) {
    const auto k = static_cast<std::int64_t>(micro);
    const std::size_t a = r0->record(0, k), b = r1->record(0, k);
    r0->stage_forward(a, tokens[micro].data(), targets[micro].data(), 0.25f, true);
    copy(r0->stage_output(a), r1->stage_input(b));
    r1->stage_forward(b, tokens[micro].data(), targets[micro].data(), 0.25f, true);
  }
  for (std::size_t micro = 0; micro < 2; ++micro) {
    const auto k = static_cast<std::int64_t>(micro);
    const std::size_t a = r0->record(0, k), b = r1->record(0, k), h = r0->record(1, k);
    copy(r1->stage_output(b), r0->stage_input(h));
    staged_loss +=
        r0->stage_forward(h, tokens[micro].data(), targets[micro].data(), 0.25f, true).loss_sum;
    r0->stage_backward(h);
    copy(r0->stage_gradient(), r1->stage_gradient());
    r1->stage_backward(b);
    copy(r1->stage_gradient(), r0->stage_gradient());
    r0->stage_backward(a);
  }
  EXPECT_EQ(staged_loss, whole_loss);
  for (const LanguageModel* s : {r0.get(), r1.get()})
    for (const auto& spec : s->params().specs()) {
      const Tensor x = s->params().grad(spec.name), y = whole.params().grad(spec.name);
      ASSERT_EQ(x.numel(), y.numel()) << spec.name;
      EXPECT_EQ(std::memcmp(x.data, y.data, static_cast<std::size_t>(x.numel()) * sizeof(float)), 0)
          << spec.name;
    }
}

// Tied embeddings and the MTP module on two stages: the last one holds a copy of the
// embedding table (first in its store), into which the tied head and the MTP module's
// embedding add their gradients; stage 0's table gets the embedding's. Their sum is the
// whole model's gradient (within rounding: the whole model adds the contributions micro-
// batch by micro-batch, the stages each end's over the micro-batches, then the two); every
// other gradient, the loss and the MTP loss are the whole model's bit for bit.
TEST(PipelineStages, TheLastStagesCopyOfTheTableSumsToTheWholeModelsGradient) {
  auto m = three_blocks();
  m.tie_embeddings = true;
  m.mtp_depth = 1;
  const std::int64_t B = 2, T = 4, N = B * T;
  LanguageModel whole(m, B, T, Arena::Mode::allocate);
  whole.params().initialize(7);
  whole.refresh_compute_params();
  dst::model::StageBlocks first = one_block(0, true, false, 2), last = one_block(1, false, true, 1);
  last.last = 3;
  std::vector<std::unique_ptr<LanguageModel>> stages;
  for (const auto& blocks : {first, last}) {
    stages.push_back(
        std::make_unique<LanguageModel>(m, B, T, Arena::Mode::allocate, holding({blocks})));
    stages.back()->params().initialize(7);
    stages.back()->refresh_compute_params();
  }
  const std::string table = dst::model::kEmbeddingTableName;
  ASSERT_EQ(stages[1]->params().spec(0).name, table);  // the copy, at offset 0
  EXPECT_EQ(stages[1]->params().spec(0).offset, 0u);
  EXPECT_EQ(stages[0]->params().parameter_count() + stages[1]->params().parameter_count(),
            whole.params().parameter_count() + m.vocab_size * m.d_model);
  // A stage without the head keeps no copy; neither does a last stage reading no table.
  dst::config::ModelSection plain = three_blocks();
  EXPECT_NE(dst::model::stage_parameter_layout(plain, last).front().name, table);
  EXPECT_EQ(dst::model::stage_parameter_layout(m, one_block(1, false, false, 1)).front().name,
            "model.layers.1.input_layernorm.weight");

  const auto copy = [](const Tensor& from, const Tensor& to) {
    std::memcpy(to.data, from.data, static_cast<std::size_t>(from.numel()) * sizeof(float));
  };
  whole.params().zero_grads();
  for (auto& s : stages)
    s->params().zero_grads();
  double whole_loss = 0.0, staged_loss = 0.0, whole_mtp = 0.0, staged_mtp = 0.0;
  for (int micro = 0; micro < 2; ++micro) {
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(N)), targets(tokens.size());
    for (std::int64_t i = 0; i < N; ++i) {
      tokens[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((i * 5 + micro * 3) % 13);
      targets[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((i * 7 + micro) % 13);
    }
    const MicroBatchResult w = whole.forward_backward(tokens.data(), targets.data(), 0.25f);
    whole_loss += w.loss_sum;
    whole_mtp += w.mtp_loss_sum;
    const auto slot = static_cast<std::size_t>(micro);
    stages[0]->stage_forward(slot, tokens.data(), targets.data(), 0.25f, true);
    copy(stages[0]->stage_output(slot), stages[1]->stage_input(0));
    const MicroBatchResult s1 =
        stages[1]->stage_forward(0, tokens.data(), targets.data(), 0.25f, true);
    staged_loss += s1.loss_sum;
    staged_mtp += s1.mtp_loss_sum;
    stages[1]->stage_backward(0);
    copy(stages[1]->stage_gradient(), stages[0]->stage_gradient());
    stages[0]->stage_backward(slot);
  }
  EXPECT_EQ(staged_loss, whole_loss);
  EXPECT_EQ(staged_mtp, whole_mtp);
  EXPECT_GT(whole_mtp, 0.0);
  for (const auto& s : stages)
    for (const auto& spec : s->params().specs()) {
      if (spec.name == table) continue;
      const Tensor a = s->params().grad(spec.name), b = whole.params().grad(spec.name);
      ASSERT_EQ(a.numel(), b.numel()) << spec.name;
      EXPECT_EQ(std::memcmp(a.data, b.data, static_cast<std::size_t>(a.numel()) * sizeof(float)), 0)
          << spec.name;
    }
  const Tensor g0 = stages[0]->params().grad(table), g1 = stages[1]->params().grad(table),
               g = whole.params().grad(table);
  double worst = 0.0, largest = 0.0, head_part = 0.0;
  for (std::int64_t i = 0; i < g.numel(); ++i) {
    const double sum = static_cast<double>(g0.ptr<float>()[i]) + g1.ptr<float>()[i];
    worst = std::max(worst, std::abs(sum - g.ptr<float>()[i]));
    largest = std::max(largest, std::abs(static_cast<double>(g.ptr<float>()[i])));
    head_part = std::max(head_part, std::abs(static_cast<double>(g1.ptr<float>()[i])));
  }
  EXPECT_GT(head_part, 1e-3 * largest);  // the copy's part is no rounding error
  EXPECT_LE(worst, 1e-6 * largest);
}

TEST(PipelineStages, StageBlocksFromTheDeck) {
  dst::config::RunConfig c;
  c.model = three_blocks();
  c.parallel.pipeline = 2;
  const auto s0 = dst::model::stage_blocks(c, 0, 2), s1 = dst::model::stage_blocks(c, 1, 1);
  EXPECT_EQ(s0.first, 0);
  EXPECT_EQ(s0.last, 2);  // the first stage takes the extra block
  EXPECT_TRUE(s0.embedding);
  EXPECT_FALSE(s0.head);
  EXPECT_EQ(s1.first, 2);
  EXPECT_EQ(s1.last, 3);
  EXPECT_TRUE(s1.head);
  EXPECT_THROW(dst::model::stage_blocks(c, 2, 1), dst::Error);
  c.parallel.pipeline_layers = {1, 2};
  EXPECT_EQ(dst::model::stage_blocks(c, 1, 1).first, 1);
  EXPECT_EQ(dst::model::stage_parameter_layout(c.model, dst::model::stage_blocks(c, 0, 1)).size(),
            1u + 9u);  // the embedding and one block
  // Interleaved, 2 chunks per rank over 4 blocks: rank 0 holds virtual stages 0 and 2.
  c.model.n_layers = 4;
  c.parallel.pipeline_layers.clear();
  c.parallel.pipeline_schedule = dst::config::PipelineSchedule::interleaved;
  c.parallel.virtual_stages = 2;
  EXPECT_EQ(dst::model::pipeline_chunks(c), 2);
  const auto chunks = dst::model::rank_chunks(c, 0, 4);
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[0].first, 0);
  EXPECT_EQ(chunks[1].first, 2);
  EXPECT_TRUE(chunks[0].embedding);
  EXPECT_FALSE(chunks[1].head);
  EXPECT_EQ(chunks[0].slots, dst::model::chunk_in_flight(2, 0, 2, 4)[0]);
  EXPECT_TRUE(dst::model::rank_chunks(c, 1, 4)[1].head);
  EXPECT_EQ(dst::model::rank_chunks(c, 1, 4)[1].slots, 1);
  EXPECT_THROW(dst::model::rank_chunks(c, 2, 4), dst::Error);
  EXPECT_THROW(dst::model::rank_chunks(c, 0, 3), dst::Error);  // 3 micro-batches: not groups of 2
}

// Which pipeline stages store their own experts: those with a DeepSeekMoE block, the MTP
// module's counted on the head's stage (tiny-moe with every block dense but the module's).
TEST(PipelineStages, StagesWithAnMoeBlockStoreTheirOwnExperts) {
  dst::config::RunConfig c;
  c.model = dst::config::preset_model("tiny-moe");  // block 0 dense, 1-3 DeepSeekMoE
  c.parallel.pipeline = 2;
  c.parallel.expert = 2;
  EXPECT_TRUE(dst::model::own_expert_storage(c, 0));
  EXPECT_TRUE(dst::model::own_expert_storage(c, 1));
  c.model.first_k_dense_replace = 3;  // only block 3, on stage 1
  EXPECT_FALSE(dst::model::own_expert_storage(c, 0));
  EXPECT_TRUE(dst::model::own_expert_storage(c, 1));
  c.model.first_k_dense_replace = c.model.n_layers;  // the MTP module's block only
  EXPECT_FALSE(dst::model::own_expert_storage(c, 1));
  c.model.mtp_depth = 1;
  ASSERT_TRUE(c.model.moe_layer(c.model.n_layers));
  EXPECT_FALSE(dst::model::own_expert_storage(c, 0));
  EXPECT_TRUE(dst::model::own_expert_storage(c, 1));
  c.parallel.pipeline = 1;
  EXPECT_TRUE(dst::model::own_expert_storage(c));
  c.model.n_routed_experts = 0;
  EXPECT_FALSE(dst::model::own_expert_storage(c));
}

}  // namespace
