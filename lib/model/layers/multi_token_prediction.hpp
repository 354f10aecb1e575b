#pragma once
/// \file multi_token_prediction.hpp
/// DeepSeek-V3's multi-token prediction module (report section 2.2), depth 1: at position
/// t it predicts token t+2 from the main model's output at t and the embedding of token
/// t+1:
///   x   = eh_proj([enorm(Emb(t+1)); hnorm(h_t)])      (2C -> C, no bias)
///   out = Block(x)                                     (the model's last block's kind)
///   logits = lm_head(shared_head.norm(out))            (the model's own projection)
/// h_t is the main head's normalised output (what its lm_head multiplies), and the
/// embedding comes first in the concatenation: so vLLM's and Megatron-LM's MTP layers
/// read DeepSeek-V3's released MTP weights (the report's equation 21 writes the two halves
/// the other way round and leaves the norm implicit). Parameter names are those of V3's
/// checkpoint layer model.layers.<n_layers>: enorm, hnorm, eh_proj, the block's own,
/// shared_head.norm. The embedding table and lm_head are the model's (V3's checkpoint
/// stores copies as embed_tokens and shared_head.head; dstrain's export writes them).
///
/// Targets from the (B, T + 1) samples: the main model reads s[0..T) and predicts
/// s[1..T] (its `targets`); the module reads tokens targets[t] = s[t + 1] (padding: 0)
/// and predicts targets[t + 1] = s[t + 2] for t < T - 1; position T - 1 has no token
/// t + 2 in the sample and is ignored (model::kIgnoreIndex). The attention is causal, so
/// that last position changes nothing at the others (its routing is counted in an MoE
/// block's loads and balance loss like any token's).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "config/run_config.hpp"
#include "model/layers/block.hpp"
#include "model/layers/embedding.hpp"
#include "model/layers/head.hpp"
#include "model/layers/layer.hpp"
#include "model/layers/moe_dispatch.hpp"
#include "model/layers/rmsnorm.hpp"
#include "tensor/arena.hpp"

namespace dst::model {

/// What the module keeps from forward for backward. N = B*T; R = N, or N / T under
/// sequence parallelism (this rank's rows).
struct MtpActs {
  tensor::Tensor tokens;   // (N) i32 its input tokens t+1 (the main targets, padding 0)
  tensor::Tensor targets;  // (N) i32 tokens t+2 (the main targets shifted; last ignored)
  tensor::Tensor emb;      // (R, C) Emb(tokens)
  RmsNormActs enorm;       // (R, C), (R)
  RmsNormActs hnorm;       // (R, C), (R) of the main head's normalised output
  BlockActs block;         // block.x (R, C): eh_proj's output
  HeadActs head;           // x: the block's output; shared_head.norm; logits (N, V); losses
};

/// Backward scratch of the module (besides the blocks' BlockScratch).
struct MtpScratch {
  tensor::Tensor d_h;     // (R, C) d(loss)/d(hnorm output)
  tensor::Tensor d_main;  // (R, C) d(MTP loss)/d(the main head's normalised output)
};

class MultiTokenPrediction {
 public:
  /// The module after the model `m`'s n_layers blocks (m.mtp_depth must be 1).
  /// `tensor_parallel` T: its block split as the model's (a DeepSeekMoE layer whole on
  /// each rank), its head's projection the model head's vocabulary slice; enorm, hnorm and
  /// eh_proj replicated (every rank computes the block's whole input).
  /// `sequence_parallel` (with T > 1): as the model's blocks, the module keeps this rank's
  /// N / T token rows of its embedding, norms, eh_proj output and block (a
  /// sequence-parallel Block), and its head gathers its norm's rows (Head::forward).
  /// eh_proj's weight gradient is computed whole on every rank from the gathered rows of
  /// its output gradient and inputs (the same sum as without the split); enorm's and
  /// hnorm's are summed over the group (RmsNorm::backward_rows).
  /// `ep`: expert parallelism's storage, as the model's blocks (a DeepSeekMoE block holds
  /// its slice of the routed experts only).
  explicit MultiTokenPrediction(const config::ModelSection& m, int tensor_parallel = 1,
                                const ExpertSlice& ep = {}, bool sequence_parallel = false);

  /// model.layers.<L>.enorm.weight, .hnorm.weight, .eh_proj.weight (C, 2C), the block's
  /// parameters (Block::declare), .shared_head.norm.weight, in this order: declared after
  /// the model's head, so its gradients are final before the head's and the embedding's.
  void declare(std::vector<ParamSpec>& specs) const;
  void bind(const ParamStore& params);
  const Block& block() const { return block_; }

  /// The record of B sequences of T tokens; the block's as Block::take (`shared`: the
  /// blocks' shared record under `recompute`).
  MtpActs take(tensor::Arena& arena, std::int64_t B, std::int64_t T, bool fused,
               config::Recompute recompute, const BlockActs& shared) const;
  /// The scratch for N token rows (R of them this rank's).
  MtpScratch take_scratch(tensor::Arena& arena, std::int64_t N) const;

  /// The module's input tokens and targets (B, T) from the main model's targets (B, T),
  /// host memory (see the file comment).
  static void make_targets(const std::int32_t* targets, std::int64_t B, std::int64_t T,
                           std::int32_t* mtp_tokens, std::int32_t* mtp_targets);

  /// a.head.logits (N, V) from a.tokens (filled by the caller) and h (R, C), the main
  /// head's normalised output (under sequence parallelism this rank's rows of it,
  /// Head::normalised); keeps a.
  void forward(const Compute& c, const Embedding& embedding, const Rope& rope, std::int64_t B,
               std::int64_t T, const tensor::Tensor& h, const MtpActs& a) const;
  /// The per-token losses (a.head.losses, 0 where ignored); with a gradient:
  /// a.head.logits becomes d(grad_scale * sum of losses)/d(logits).
  void loss(const Compute& c, const MtpActs& a) const;
  void loss_and_gradient(const Compute& c, const MtpActs& a, float grad_scale) const;

  /// Backward from the gradient in a.head.logits: accumulates the module's, the shared
  /// head's and the embedding's gradients and writes s.d_main = d(loss)/d(h), for the main
  /// head's backward (Head::backward's d_out; R rows). `d_x`, `bs`: the
  /// model's (N, C) residual gradient buffer and the blocks' scratch, used as scratch.
  /// Calls ready() as its
  /// parameters' gradients become final (the block's twice, then the module's first).
  void backward(const Compute& c, const Embedding& embedding, const Rope& rope, std::int64_t B,
                std::int64_t T, const tensor::Tensor& h, const MtpActs& a, const BlockScratch& bs,
                const MtpScratch& s, const tensor::Tensor& d_x, const OnReady& ready) const;

 private:
  RmsNorm enorm_, hnorm_;
  std::string eh_name_;
  std::size_t eh_proj_ = 0;
  Block block_;
  Head head_;  // shared_head.norm with the model's projection
  std::int64_t C_;
  TokenRows rows_;  // whole rows, or a rank's rows under sequence parallelism
  std::int64_t rows(std::int64_t N) const { return rows_.rows(N); }
};

}  // namespace dst::model
