#pragma once
/// \file block.hpp
/// One transformer block, pre-norm with residuals:
///   mid = x + attention(rmsnorm(x));  out = mid + mlp(rmsnorm(mid))
///
/// Sequence parallelism (TensorSlice::sequence, tensor group of T ranks; Korthikanti et
/// al. 2022): x, mid, out and both norms hold this rank's N / T token rows only. Each
/// norm's rows are all-gathered into the (N, C) input of the attention or the MLP (this
/// rank's heads or ffn columns), whose partial sums are reduce-scattered back to this
/// rank's rows: the same volume as tensor parallelism's all-reduce, 1 / T of the
/// residual stream's and the norms' activations. Backward mirrors it (the gradient of an
/// all-gather is a reduce-scatter and vice versa) and re-gathers the norms' rows rather
/// than keep them whole; each norm weight's gradient, a sum over this rank's rows, is
/// summed over the tensor group per micro-batch. A DeepSeekMoE layer (whole on every rank
/// of the group, as under tensor parallelism alone) gathers its input's rows, runs on
/// every row and keeps this rank's rows of its output; backward gathers the output
/// gradient and the input again and keeps this rank's rows of the input gradient (every
/// rank computed the same, so nothing is summed).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "config/run_config.hpp"
#include "model/layers/attention.hpp"
#include "model/layers/latent_attention.hpp"
#include "model/layers/layer.hpp"
#include "model/layers/mlp.hpp"
#include "model/layers/moe.hpp"
#include "model/layers/rmsnorm.hpp"
#include "model/layers/token_rows.hpp"
#include "tensor/arena.hpp"

namespace dst::model {

/// What one block keeps from forward for backward.  N = B*T. Under training.recompute
/// the tensors it does not keep are views of one buffer shared by every block
/// (Block::take_shared), which the forward overwrites block after block and the backward
/// refills for its block before using them.
struct BlockActs {
  tensor::Tensor x;         // (N, C) block input (residual stream): always its own
  RmsNormActs norm1;        // (N, C), (N) rmsnorm(x)
  AttentionActs attn;       // q, k, v, probs or stats, attn (standard attention)
  LatentAttentionActs mla;  // multi-head latent attention (model.kv_lora_rank > 0)
  tensor::Tensor mid;       // (N, C) x + o_proj(attn)
  RmsNormActs norm2;        // (N, C), (N) rmsnorm(mid)
  MlpActs mlp;              // h1, h3, g (dense MLP)
  MoeActs moe;              // DeepSeekMoE (model.moe_layer(l)); its host routing is the block's own
  /// selective: the attention probabilities (attn.probs or mla.probs) are shared; full:
  /// everything but x and the MoE routing is shared.
  config::Recompute recompute = config::Recompute::none;
  /// Sequence parallelism: (N, C) buffers every block shares (the workspace's): the
  /// gathered rows the attention and MLP read, and their partial sums (in backward: the
  /// gathered gradient of their output). Empty otherwise.
  tensor::Tensor gathered, partial;
};

/// Backward scratch shared by all blocks.
struct BlockScratch {
  tensor::Tensor d_ln;    // (N, C) gradient of a norm's output
  tensor::Tensor d_norm;  // (C) sequence parallelism: a norm weight's gradient of one micro-batch
  AttentionScratch attn;
  LatentAttentionScratch mla;
  MlpScratch mlp;
  MoeScratch moe;
};

class Block {
 public:
  /// Block `layer` (0-based) of the model `m`: its parameters are "model.layers.<layer>.*".
  /// `tensor_parallel` T > 1: this rank's slice of its attention (standard or latent) and
  /// dense MLP (tensor_parallel.hpp); a DeepSeekMoE layer is computed whole on every rank
  /// of the group, its parameters replicated (not with `sequence_parallel`).
  /// `ep`: expert parallelism's storage (an MoE block holds its slice of the routed
  /// experts only; moe_dispatch.hpp).
  /// `sequence_parallel` (with tensor_parallel T > 1): x, mid, out and the norms are this
  /// rank's N / T token rows (above).
  Block(const config::ModelSection& m, std::int64_t layer, int tensor_parallel = 1,
        const ExpertSlice& ep = {}, bool sequence_parallel = false);

  /// input_layernorm, self_attn.{q,k,v,o}_proj (or latent attention's, LatentAttention::
  /// declare), post_attention_layernorm, mlp.{gate,up,down}_proj (or DeepSeekMoE's,
  /// Moe::declare), in this order.
  void declare(std::vector<ParamSpec>& specs) const;
  void bind(const ParamStore& params);
  /// The RoPE tables' head dim: the head dim, or qk_rope_head_dim with latent attention.
  std::int64_t head_dim() const { return mla_ ? mla_->rope_dim() : attn_.head_dim(); }

  /// The part of the activation records every block shares under `recompute`, taken once
  /// (from the workspace): full: a whole record but x (one block's activations, with the
  /// dense MLP's and the MoE layer's parts as the model has them, without MoE routing);
  /// selective: the attention probabilities, (B, H, T, T) (none when `fused` with standard
  /// attention); none: nothing.
  BlockActs take_shared(tensor::Arena& arena, std::int64_t B, std::int64_t T, bool fused,
                        config::Recompute recompute) const;
  /// This block's record of B sequences of T tokens: what `recompute` keeps comes from
  /// `arena`, the rest are the views of `shared` (from take_shared; unused for none). An
  /// MoE block's host routing is always its own (its expert loads are the block's). Under
  /// sequence parallelism the caller puts the shared (N, C) buffers in shared.gathered and
  /// shared.partial first.
  BlockActs take(tensor::Arena& arena, std::int64_t B, std::int64_t T, bool fused,
                 config::Recompute recompute = config::Recompute::none,
                 const BlockActs& shared = {}) const;
  /// The scratch every block of the model can share (dense MLP and MoE parts as the model
  /// has them, whichever block takes it).
  BlockScratch take_scratch(tensor::Arena& arena, std::int64_t B, std::int64_t T, bool fused) const;
  /// The block's DeepSeekMoE layer; nullptr for a dense MLP block.
  const Moe* moe() const { return moe_ ? &*moe_ : nullptr; }

  /// out (N, C) = the block of a.x (N, C), B sequences of T tokens; keeps a. `out` may be
  /// a.x (decoding overwrites its rows in place). Decoding passes the cache of the block's
  /// attention kind: `cache` (Attention::forward) or `latent_cache`
  /// (LatentAttention::forward).
  void forward(const Compute& c, const Rope& rope, std::int64_t B, std::int64_t T,
               const BlockActs& a, const tensor::Tensor& out, const KVCache* cache = nullptr,
               const LatentKVCache* latent_cache = nullptr) const;
  /// Whether the block's attention is latent attention (decoding needs a LatentKVCache).
  bool latent() const { return mla_.has_value(); }
  /// d_x (N, C) holds d(loss)/d(out) on entry, d(loss)/d(a.x) on return; accumulates the
  /// weights' gradients. First recomputes what a.recompute did not keep: full: the
  /// block's forward from a.x (its output goes to s.d_ln, unused until the MLP's backward
  /// writes it); selective: the attention probabilities. Calls ready() twice: after the MLP half
  /// (the post-attention norm's offset) and at the end (the block's first parameter: all of it is
  /// final).
  void backward(const Compute& c, const Rope& rope, std::int64_t B, std::int64_t T,
                const BlockActs& a, const BlockScratch& s, const tensor::Tensor& d_x,
                const OnReady& ready) const;

 private:
  /// Everything but x: norm1, attention (`keep_probs`: its probabilities too), mid,
  /// norm2, the feed-forward part, in this order. `shared`: the record every block shares
  /// (full recompute): the dense MLP's and the MoE layer's parts as the model has them,
  /// without MoE routing; otherwise this block's part (an MoE block's routing with it).
  void take_inner(tensor::Arena& arena, std::int64_t B, std::int64_t T, bool fused, bool keep_probs,
                  bool shared, BlockActs& a) const;
  /// The rows of x and of the norms a rank keeps: B T, or B T / the tensor group's size
  /// under sequence parallelism.
  std::int64_t rows(std::int64_t B, std::int64_t T) const { return rows_.rows(B * T); }
  /// forward(); `recomputing`: the backward's refill of a full-recompute record, which
  /// must not count the MoE layer's expert choices a second time.
  void run_forward(const Compute& c, const Rope& rope, std::int64_t B, std::int64_t T,
                   const BlockActs& a, const tensor::Tensor& out, const KVCache* cache,
                   const LatentKVCache* latent_cache, bool recomputing) const;

  RmsNorm norm1_;
  Attention attn_;                      // unused with latent attention
  std::optional<LatentAttention> mla_;  // model.kv_lora_rank > 0
  RmsNorm norm2_;
  Mlp mlp_;                       // unused in an MoE block
  std::optional<Moe> moe_;        // model.moe_layer(layer)
  bool model_dense_mlp_;          // some block of the model has the dense MLP
  std::optional<Moe> model_moe_;  // the model's MoE shape (for the shared scratch)
  std::int64_t C_;
  TokenRows rows_;  // whole rows, or a rank's rows under sequence parallelism
};

}  // namespace dst::model
