#include "model/layers/block.hpp"

#include <cmath>
#include <string>

#include "core/error.hpp"
#include "kernels/kernels.hpp"
#include "model/layers/tensor_parallel.hpp"
#include "tensor/memory.hpp"

namespace dst::model {

namespace {
std::string layer_prefix(std::int64_t layer) {
  return "model.layers." + std::to_string(layer) + ".";
}

/// The initial standard deviation of the output projections (o_proj, down_proj): kInitStd
/// scaled by 1/sqrt(2 * n_layers), so the residual stream's variance does not grow with
/// depth (GPT-2, Radford et al. 2019, section 2.3).
float residual_std(const config::ModelSection& m) {
  return kInitStd / std::sqrt(2.0f * static_cast<float>(m.n_layers));
}
}  // namespace

Block::Block(const config::ModelSection& m, std::int64_t layer, int tensor_parallel,
             const ExpertSlice& ep, bool sequence_parallel)
    : norm1_(layer_prefix(layer) + "input_layernorm.weight", m.d_model,
             static_cast<float>(m.norm_eps)),
      attn_(layer_prefix(layer) + "self_attn.", m.d_model, m.n_heads, m.n_kv_heads, residual_std(m),
            tensor_parallel),
      norm2_(layer_prefix(layer) + "post_attention_layernorm.weight", m.d_model,
             static_cast<float>(m.norm_eps)),
      mlp_(layer_prefix(layer) + "mlp.", m.d_model, m.ffn_dim, residual_std(m), tensor_parallel),
      model_dense_mlp_(m.n_routed_experts == 0 || m.first_k_dense_replace > 0),
      C_(m.d_model),
      row_split_(sequence_parallel ? tensor_parallel : 1) {
  if (m.mla())
    mla_.emplace(layer_prefix(layer) + "self_attn.", m, residual_std(m), tensor_parallel);
  if (m.moe_layer(layer)) moe_.emplace(layer_prefix(layer) + "mlp.", m, residual_std(m), ep);
  if (m.n_routed_experts > 0) model_moe_.emplace(layer_prefix(layer) + "mlp.", m, residual_std(m));
}

void Block::declare(std::vector<ParamSpec>& specs) const {
  norm1_.declare(specs);
  if (mla_)
    mla_->declare(specs);
  else
    attn_.declare(specs);
  norm2_.declare(specs);
  if (moe_)
    moe_->declare(specs);
  else
    mlp_.declare(specs);
}

void Block::bind(const ParamStore& params) {
  norm1_.bind(params);
  if (mla_)
    mla_->bind(params);
  else
    attn_.bind(params);
  norm2_.bind(params);
  if (moe_)
    moe_->bind(params);
  else
    mlp_.bind(params);
}

void Block::take_inner(tensor::Arena& arena, std::int64_t B, std::int64_t T, bool fused,
                       bool keep_probs, bool shared, BlockActs& a) const {
  const std::int64_t N = B * T;
  a.norm1 = norm1_.take(arena, rows(B, T), "ln1", "rstd1");
  if (mla_)
    a.mla = mla_->take(arena, B, T, keep_probs);
  else
    a.attn = attn_.take(arena, B, T, fused, keep_probs);
  a.mid = arena.take("mid", {rows(B, T), C_}, DType::f32);
  a.norm2 = norm2_.take(arena, rows(B, T), "ln2", "rstd2");
  if (shared) {
    if (model_dense_mlp_) a.mlp = mlp_.take(arena, N);
    if (model_moe_) a.moe = model_moe_->take(arena, N, false);
  } else if (moe_) {
    a.moe = moe_->take(arena, N, !arena.planning());
  } else {
    a.mlp = mlp_.take(arena, N);
  }
}

BlockActs Block::take_shared(tensor::Arena& arena, std::int64_t B, std::int64_t T, bool fused,
                             config::Recompute recompute) const {
  BlockActs a;
  a.recompute = recompute;
  if (recompute == config::Recompute::full)
    take_inner(arena, B, T, fused, true, true, a);
  else if (recompute == config::Recompute::selective && mla_)
    a.mla.probs = mla_->take_probs(arena, B, T);
  else if (recompute == config::Recompute::selective && !fused)
    a.attn.probs = attn_.take_probs(arena, B, T);
  return a;
}

BlockActs Block::take(tensor::Arena& arena, std::int64_t B, std::int64_t T, bool fused,
                      config::Recompute recompute, const BlockActs& shared) const {
  const std::int64_t N = B * T;
  if (row_split_ > 1 && (shared.gathered.numel() != N * C_ || shared.partial.numel() != N * C_))
    throw Error("model: a sequence-parallel block's record needs the shared (" + std::to_string(N) +
                ", " + std::to_string(C_) + ") buffers");
  BlockActs a;
  if (recompute == config::Recompute::full) a = shared;
  a.gathered = shared.gathered;
  a.partial = shared.partial;
  a.x = arena.take("x", {rows(B, T), C_}, DType::f32);
  if (recompute == config::Recompute::full) {
    // The routing is host state the trainer reads after the step (the block's expert loads).
    if (moe_ && !arena.planning()) a.moe.routing = moe_->make_routing(N);
  } else {
    const bool selective = recompute == config::Recompute::selective;
    take_inner(arena, B, T, fused, !selective, false, a);
    if (selective) {
      a.attn.probs = shared.attn.probs;
      a.mla.probs = shared.mla.probs;
    }
  }
  a.recompute = recompute;
  return a;
}

BlockScratch Block::take_scratch(tensor::Arena& arena, std::int64_t B, std::int64_t T,
                                 bool fused) const {
  BlockScratch s;
  s.d_ln = arena.take("d_ln", {B * T, C_}, DType::f32);
  if (row_split_ > 1) s.d_norm = arena.take("d_norm", {C_}, DType::f32);
  if (mla_)
    s.mla = mla_->take_scratch(arena, B, T);
  else
    s.attn = attn_.take_scratch(arena, B, T, fused);
  if (model_dense_mlp_) s.mlp = mlp_.take_scratch(arena, B * T);
  if (model_moe_) s.moe = model_moe_->take_scratch(arena, B * T);
  return s;
}

void Block::forward(const Compute& c, const Rope& rope, std::int64_t B, std::int64_t T,
                    const BlockActs& a, const tensor::Tensor& out, const KVCache* cache,
                    const LatentKVCache* latent_cache) const {
  run_forward(c, rope, B, T, a, out, cache, latent_cache, false);
}

void Block::run_forward(const Compute& c, const Rope& rope, std::int64_t B, std::int64_t T,
                        const BlockActs& a, const tensor::Tensor& out, const KVCache* cache,
                        const LatentKVCache* latent_cache, bool recomputing) const {
  // store(): each activation as a 16-bit back end would keep it (identity for f32).
  // Norm statistics (rstd), softmax and the loss reduce in fp32 and are not rounded.
  norm1_.forward(c, a.x, a.norm1);
  if (mla_ ? cache != nullptr : latent_cache != nullptr)
    throw Error(std::string("model: decoding a block of ") +
                (mla_ ? "latent attention needs a latent KV cache, not a key/value one"
                      : "standard attention needs a key/value cache, not a latent one"));
  if (row_split_ > 1 && (cache != nullptr || latent_cache != nullptr))
    throw Error("model: decoding does not split the token rows (sequence parallelism)");
  if (row_split_ > 1) {
    // This rank's rows of the norm, gathered; this rank's heads' share of every row,
    // summed over the group and scattered back to this rank's rows.
    const Compute part = part_context(c);
    c.tensor->all_gather(a.norm1.out, a.gathered);
    if (mla_)
      mla_->forward(part, rope, B, T, a.gathered, a.mla, a.partial);
    else
      attn_.forward(part, rope, B, T, a.gathered, a.attn, a.partial);
    c.tensor->reduce_scatter(a.partial, a.mid);
  } else if (mla_) {
    mla_->forward(c, rope, B, T, a.norm1.out, a.mla, a.mid, latent_cache);
  } else {
    attn_.forward(c, rope, B, T, a.norm1.out, a.attn, a.mid, cache);
  }
  kernels::add(c.ctx, a.mid, a.x, a.mid);
  c.store(a.mid);  // the residual stream
  norm2_.forward(c, a.mid, a.norm2);
  if (row_split_ > 1 && moe_) {
    // A DeepSeekMoE layer under sequence parallelism: every row's input gathered, the layer
    // computed whole (as under tensor parallelism alone, its parameters replicated), this
    // rank's rows of its output kept.
    row_group(c).all_gather(a.norm2.out, a.gathered);
    moe_->forward(replicated(c), B, T, a.gathered, a.moe, a.partial, !recomputing);
    const tensor::Tensor own = own_rows(c, a.partial, B, T);
    tensor::copy(c.ctx, out.ptr<float>(), own.ptr<float>(),
                 static_cast<std::size_t>(own.numel()) * sizeof(float));
  } else if (row_split_ > 1) {
    const Compute part = part_context(c);
    c.tensor->all_gather(a.norm2.out, a.gathered);
    mlp_.forward(part, a.gathered, a.mlp, a.partial);
    c.tensor->reduce_scatter(a.partial, out);
  } else if (moe_) {
    moe_->forward(replicated(c), B, T, a.norm2.out, a.moe, out, !recomputing);
  } else {
    mlp_.forward(c, a.norm2.out, a.mlp, out);
  }
  kernels::add(c.ctx, out, a.mid, out);
  c.store(out);  // the residual stream: the next block's input
}

void Block::backward(const Compute& c, const Rope& rope, std::int64_t B, std::int64_t T,
                     const BlockActs& a, const BlockScratch& s, const tensor::Tensor& d_x,
                     const OnReady& ready) const {
  // Recompute what the forward did not keep: the same operations on the same inputs and
  // weights, so the same bits as a record that kept them.
  if (a.recompute == config::Recompute::full)
    run_forward(c, rope, B, T, a, row_range(s.d_ln, 0, rows(B, T)), nullptr, nullptr, true);
  else if (a.recompute == config::Recompute::selective && mla_)
    mla_->recompute_probs(c, B, T, a.mla);
  else if (a.recompute == config::Recompute::selective)
    attn_.recompute_probs(c, B, T, a.attn);
  // MLP branch: out = mid + down(g); d_x holds d(loss)/d(out).
  if (row_split_ > 1 && moe_) {
    // Every row's output gradient and input gathered, the layer's backward whole (the same
    // bits on every rank of the group: its parameters' gradients are replicated), this
    // rank's rows of its input gradient kept: no sum over the group.
    TensorParallel& group = row_group(c);
    c.store(d_x);
    group.all_gather(d_x, a.partial);
    group.all_gather(a.norm2.out, a.gathered);
    moe_->backward(replicated(c), B, T, a.partial, a.gathered, a.moe, s.moe, s.d_ln);
    norm2_.backward_rows(c, own_rows(c, s.d_ln, B, T), a.mid, a.norm2, d_x, s.d_norm);
  } else if (row_split_ > 1) {
    split_backward(c, rows(B, T), a, norm2_, a.mid, a.norm2, s, d_x,
                   [&](const Compute& part, const tensor::Tensor& dout, const tensor::Tensor& in) {
                     mlp_.backward(part, dout, in, a.mlp, s.mlp, s.d_ln);
                   });
  } else {
    if (moe_)
      moe_->backward(replicated(c), B, T, d_x, a.norm2.out, a.moe, s.moe, s.d_ln);
    else
      mlp_.backward(c, d_x, a.norm2.out, a.mlp, s.mlp, s.d_ln);
    norm2_.backward(c, s.d_ln, a.mid, a.norm2, d_x);
  }
  ready(c.offset(norm2_.weight()));  // a chance to poll in-flight buckets mid-block
  // Attention branch: mid = x + o_proj(attn); d_x now holds d(loss)/d(mid).
  if (row_split_ > 1) {
    split_backward(c, rows(B, T), a, norm1_, a.x, a.norm1, s, d_x,
                   [&](const Compute& part, const tensor::Tensor& dout, const tensor::Tensor& in) {
                     if (mla_)
                       mla_->backward(part, rope, B, T, dout, in, a.mla, s.mla, s.d_ln);
                     else
                       attn_.backward(part, rope, B, T, dout, in, a.attn, s.attn, s.d_ln);
                   });
  } else {
    if (mla_)
      mla_->backward(c, rope, B, T, d_x, a.norm1.out, a.mla, s.mla, s.d_ln);
    else
      attn_.backward(c, rope, B, T, d_x, a.norm1.out, a.attn, s.attn, s.d_ln);
    norm1_.backward(c, s.d_ln, a.x, a.norm1, d_x);
  }
  ready(c.offset(norm1_.weight()));  // the block's first tensor: the whole block is final
}

Compute Block::replicated(const Compute& c) {
  // Tensor parallelism computes a DeepSeekMoE layer whole on every rank of the group (its
  // parameters replicated, its input and output whole): no tensor group inside it, so its
  // shared experts' MLP does not sum its output over the group.
  Compute whole = c;
  whole.tensor = nullptr;
  return whole;
}

TensorParallel& Block::row_group(const Compute& c) const {
  if (c.tensor == nullptr || c.tensor->size() != row_split_)
    throw Error("model: a sequence-parallel block split over " + std::to_string(row_split_) +
                " ranks needs its tensor group (DenseModel::set_tensor_parallel)");
  return *c.tensor;
}

tensor::Tensor Block::own_rows(const Compute& c, const tensor::Tensor& whole, std::int64_t B,
                               std::int64_t T) const {
  // The group's ranks hold consecutive row ranges, in rank order (TensorGroup's gather).
  const std::int64_t n = rows(B, T);
  return row_range(whole, static_cast<std::int64_t>(c.tensor->rank()) * n, n);
}

Compute Block::part_context(const Compute& c) const {
  row_group(c);
  Compute part = c;
  part.keep_partial = true;
  return part;
}

void Block::split_backward(const Compute& c, std::int64_t rows, const BlockActs& a,
                           const RmsNorm& norm, const tensor::Tensor& norm_in,
                           const RmsNormActs& norm_acts, const BlockScratch& s,
                           const tensor::Tensor& d_x, const PartBackward& part_backward) const {
  // Every row's output gradient and input (gathered), this rank's heads' or ffn columns'
  // share of the input gradient, summed over the group and scattered back to its rows.
  const Compute part = part_context(c);
  const tensor::Tensor d_ln = row_range(a.gathered, 0, rows);
  c.store(d_x);  // as the part's backward rounds its output gradient in place
  c.tensor->all_gather(d_x, a.partial);
  c.tensor->all_gather(norm_acts.out, a.gathered);
  part_backward(part, a.partial, a.gathered);
  c.tensor->reduce_scatter(s.d_ln, d_ln);
  norm.backward_rows(c, d_ln, norm_in, norm_acts, d_x, s.d_norm);
}

}  // namespace dst::model
