#pragma once
/// \file block.hpp
/// One transformer block, pre-norm with residuals:
///   mid = x + attention(rmsnorm(x));  out = mid + mlp(rmsnorm(mid))

#include <cstddef>
#include <cstdint>
#include <vector>

#include "config/run_config.hpp"
#include "model/layers/attention.hpp"
#include "model/layers/layer.hpp"
#include "model/layers/mlp.hpp"
#include "model/layers/rmsnorm.hpp"
#include "tensor/arena.hpp"

namespace dst::model {

/// What one block keeps from forward for backward.  N = B*T. Under training.recompute
/// the tensors it does not keep are views of one buffer shared by every block
/// (Block::take_shared), which the forward overwrites block after block and the backward
/// refills for its block before using them.
struct BlockActs {
  tensor::Tensor x;    // (N, C) block input (residual stream): always its own
  RmsNormActs norm1;   // (N, C), (N) rmsnorm(x)
  AttentionActs attn;  // q, k, v, probs or stats, attn
  tensor::Tensor mid;  // (N, C) x + o_proj(attn)
  RmsNormActs norm2;   // (N, C), (N) rmsnorm(mid)
  MlpActs mlp;         // h1, h3, g
  /// selective: attn.probs is shared; full: everything but x is shared.
  config::Recompute recompute = config::Recompute::none;
};

/// Backward scratch shared by all blocks.
struct BlockScratch {
  tensor::Tensor d_ln;  // (N, C) gradient of a norm's output
  AttentionScratch attn;
  MlpScratch mlp;
};

class Block {
 public:
  /// Block `layer` (0-based) of the model `m`: its parameters are "model.layers.<layer>.*".
  Block(const config::ModelSection& m, std::int64_t layer);

  /// input_layernorm, self_attn.{q,k,v,o}_proj, post_attention_layernorm,
  /// mlp.{gate,up,down}_proj, in this order.
  void declare(std::vector<ParamSpec>& specs) const;
  void bind(const ParamStore& params);
  std::int64_t head_dim() const { return attn_.head_dim(); }

  /// The part of the activation records every block shares under `recompute`, taken once
  /// (from the workspace): full: a whole record but x (one block's activations);
  /// selective: attention's (B, H, T, T) probabilities (none when `fused`); none: nothing.
  BlockActs take_shared(tensor::Arena& arena, std::int64_t B, std::int64_t T, bool fused,
                        config::Recompute recompute) const;
  /// This block's record of B sequences of T tokens: what `recompute` keeps comes from
  /// `arena`, the rest are the views of `shared` (from take_shared; unused for none).
  BlockActs take(tensor::Arena& arena, std::int64_t B, std::int64_t T, bool fused,
                 config::Recompute recompute = config::Recompute::none,
                 const BlockActs& shared = {}) const;
  BlockScratch take_scratch(tensor::Arena& arena, std::int64_t B, std::int64_t T, bool fused) const;

  /// out (N, C) = the block of a.x (N, C), B sequences of T tokens; keeps a. `out` may be
  /// a.x (decoding overwrites its rows in place). `cache`: see Attention::forward.
  void forward(const Compute& c, const Rope& rope, std::int64_t B, std::int64_t T,
               const BlockActs& a, const tensor::Tensor& out, const KVCache* cache = nullptr) const;
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
  /// norm2, mlp, in this order.
  void take_inner(tensor::Arena& arena, std::int64_t B, std::int64_t T, bool fused, bool keep_probs,
                  BlockActs& a) const;

  RmsNorm norm1_;
  Attention attn_;
  RmsNorm norm2_;
  Mlp mlp_;
  std::int64_t C_;
};

}  // namespace dst::model
