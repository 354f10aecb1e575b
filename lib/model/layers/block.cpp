#include "model/layers/block.hpp"

#include <cmath>
#include <string>

#include "core/error.hpp"
#include "kernels/kernels.hpp"

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
      rows_(sequence_parallel ? tensor_parallel : 1) {
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
  if (rows_.split() > 1 && (shared.gathered.numel() != N * C_ || shared.partial.numel() != N * C_))
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
  if (rows_.split() > 1) s.d_norm = arena.take("d_norm", {C_}, DType::f32);
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
  if (rows_.split() > 1 && (cache != nullptr || latent_cache != nullptr))
    throw Error("model: decoding does not split the token rows (sequence parallelism)");
  const RowBuffers buf{a.gathered, a.partial, {}};
  rows_.forward(c, Part::split, a.norm1.out, buf, a.mid,
                [&](const Compute& part, const tensor::Tensor& in, const tensor::Tensor& o) {
                  if (mla_)
                    mla_->forward(part, rope, B, T, in, a.mla, o, latent_cache);
                  else
                    attn_.forward(part, rope, B, T, in, a.attn, o, cache);
                });
  kernels::add(c.ctx, a.mid, a.x, a.mid);
  c.store(a.mid);  // the residual stream
  norm2_.forward(c, a.mid, a.norm2);
  rows_.forward(c, moe_ ? Part::replicated : Part::split, a.norm2.out, buf, out,
                [&](const Compute& part, const tensor::Tensor& in, const tensor::Tensor& o) {
                  if (moe_)
                    moe_->forward(part, B, T, in, a.moe, o, !recomputing);
                  else
                    mlp_.forward(part, in, a.mlp, o);
                });
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
  const RowBuffers buf{a.gathered, a.partial, s.d_norm};
  rows_.backward(c, moe_ ? Part::replicated : Part::split, norm2_, a.mid, a.norm2, buf, s.d_ln, d_x,
                 [&](const Compute& part, const tensor::Tensor& dout, const tensor::Tensor& in) {
                   if (moe_)
                     moe_->backward(part, B, T, dout, in, a.moe, s.moe, s.d_ln);
                   else
                     mlp_.backward(part, dout, in, a.mlp, s.mlp, s.d_ln);
                 });
  ready(c.offset(norm2_.weight()));  // a chance to poll in-flight buckets mid-block
  // Attention branch: mid = x + o_proj(attn); d_x now holds d(loss)/d(mid).
  rows_.backward(c, Part::split, norm1_, a.x, a.norm1, buf, s.d_ln, d_x,
                 [&](const Compute& part, const tensor::Tensor& dout, const tensor::Tensor& in) {
                   if (mla_)
                     mla_->backward(part, rope, B, T, dout, in, a.mla, s.mla, s.d_ln);
                   else
                     attn_.backward(part, rope, B, T, dout, in, a.attn, s.attn, s.d_ln);
                 });
  ready(c.offset(norm1_.weight()));  // the block's first tensor: the whole block is final
}

}  // namespace dst::model
