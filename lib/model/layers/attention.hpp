#pragma once
/// \file attention.hpp
/// Causal self-attention with rotary position embeddings (rotate-half), MHA or GQA:
///   q, k, v = x Wq^T, x Wk^T, x Wv^T; RoPE on q and k; softmax(q k^T / sqrt(D)) v per
///   head (query head h reads key/value head h / (H / KV)); out = o_proj(heads).
/// Three ways to compute the softmax(..) v part, one forward: unfused (products and
/// kernels::causal_softmax_*, grouped as kernels::attention_grouping says), fused
/// (kernels::fused_attention_*, where the back end has it and the run need not be bitwise
/// deterministic), and cached (decoding: the new rows against a KVCache of earlier ones).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "config/run_config.hpp"
#include "model/layers/layer.hpp"
#include "tensor/arena.hpp"

namespace dst::model {

/// RoPE tables of positions [0, positions): angle(t, i) for i < D/2.
struct Rope {
  tensor::Tensor cos;  // (positions, D/2)
  tensor::Tensor sin;  // (positions, D/2)

  static Rope take(tensor::Arena& arena, std::int64_t positions, std::int64_t head_dim);
  /// Fills the tables: kernels::rope_tables, or with YaRN (`scaling`, yarn.hpp) angles
  /// t * yarn::inv_freq in double on the host, cos and sin times yarn::table_factor,
  /// rounded once to float and copied to the context's memory.
  void fill(const tensor::ExecContext& ctx, double theta,
            const config::RopeScalingSection& scaling = {}) const;
  /// The tables of positions [first, first + n).
  Rope rows(std::int64_t first, std::int64_t n) const;
};

/// What attention keeps from forward for backward (with its input, which the block
/// keeps). N = B*T rows, sequence-major.
struct AttentionActs {
  tensor::Tensor q;      // (N, H*D) after RoPE
  tensor::Tensor k;      // (N, KV*D) after RoPE
  tensor::Tensor v;      // (N, KV*D)
  tensor::Tensor probs;  // (B, H, T, T) probabilities (unfused); decoding: T x (position + T)
                         // scores scratch, kept for nothing
  tensor::Tensor stats;  // (B, H, T) softmax log-sum-exp rows (fused)
  tensor::Tensor attn;   // (N, H*D) the heads' output, before o_proj
  bool fused = false;    // computed by kernels::fused_attention_* (stats kept, not probs)
};

/// Backward scratch, shared by every attention layer of the model.
struct AttentionScratch {
  tensor::Tensor d_q, d_k, d_v;  // (N, H*D), (N, KV*D), (N, KV*D)
  tensor::Tensor d_probs;        // (B, H, T, T) (unfused)
  tensor::Tensor d_attn;         // (N, H*D)
};

/// One layer's key/value cache while decoding one sequence (B = 1): rows [0, position)
/// hold the keys (after RoPE) and values of the earlier positions; a forward with the
/// cache runs positions position .. position + T - 1 and writes their rows.
struct KVCache {
  tensor::Tensor k;  // (capacity, KV*D)
  tensor::Tensor v;  // (capacity, KV*D)
  std::int64_t position = 0;
};

/// probs[i, j] = softmax_j<=p0+i (scale * scores[i, j]), 0 beyond, for the n rows of
/// `scores` (n, len) in place: the causal mask of rows that start at position p0. The same
/// arithmetic as the Kokkos causal softmax (float exponentials of the max-shifted scaled
/// scores, double sum, one reciprocal); kernels::causal_softmax_forward handles square
/// (T, T) blocks that start at position 0 only. A host loop: decoding runs on the host.
void offset_causal_softmax(float* scores, std::int64_t n, std::int64_t p0, std::int64_t len,
                           float scale);

class Attention {
 public:
  /// `prefix`: the parameter names' ("model.layers.0.self_attn."); `dim` = heads x head
  /// dim. `out_std`: o_proj's initial standard deviation (the residual-scaled kInitStd).
  /// `tensor_parallel` T: this rank computes H/T query and KV/T key/value heads, its slice
  /// (tensor_parallel.hpp); T divides H, and divides KV or is a multiple of it (the deck
  /// checks it). T > KV: the rank holds the one key/value head its query heads read,
  /// shared with the T/KV ranks of the same head (ParamSpec::tp_replicas).
  Attention(std::string prefix, std::int64_t dim, std::int64_t heads, std::int64_t kv_heads,
            float out_std, int tensor_parallel = 1);

  /// q_proj (H*D, dim), k_proj and v_proj (KV*D, dim) split by columns (heads), o_proj
  /// (dim, H*D) by rows (with tensor parallelism, this rank's slices of them).
  void declare(std::vector<ParamSpec>& specs) const;
  void bind(const ParamStore& params);
  std::size_t first_param() const { return q_; }
  std::int64_t head_dim() const { return D_; }

  /// The record of B sequences of T tokens; `fused`: keep the fused kernels' statistics
  /// instead of the probabilities. `keep_probs` false (training.recompute selective): no
  /// probabilities either; the caller points a.probs at a buffer shared by every layer
  /// (take_probs) and the backward recomputes them first (recompute_probs).
  AttentionActs take(tensor::Arena& arena, std::int64_t B, std::int64_t T, bool fused,
                     bool keep_probs = true) const;
  /// (B, H, T, T) probabilities of one layer at a time (selective recompute).
  tensor::Tensor take_probs(tensor::Arena& arena, std::int64_t B, std::int64_t T) const;
  AttentionScratch take_scratch(tensor::Arena& arena, std::int64_t B, std::int64_t T,
                                bool fused) const;

  /// out (N, dim) = o_proj(attention(x)) for x (N, dim) of B sequences of T tokens at
  /// positions 0 .. T-1 (`rope` from position 0); keeps a. With a `cache` (B = 1): the
  /// tokens are at positions cache->position .., their keys and values go to the cache
  /// (a.k, a.v are not used) and they attend to every cached position up to their own.
  void forward(const Compute& c, const Rope& rope, std::int64_t B, std::int64_t T,
               const tensor::Tensor& x, const AttentionActs& a, const tensor::Tensor& out,
               const KVCache* cache = nullptr) const;
  /// Writes a.probs again from a.q and a.k, the same arithmetic as the forward's, so the
  /// same bits (selective recompute: the probabilities were not kept). Nothing when fused.
  void recompute_probs(const Compute& c, std::int64_t B, std::int64_t T,
                       const AttentionActs& a) const;
  /// dx (N, dim) = d(loss)/dx (written) from dout (N, dim), which is rounded in place to
  /// the storage type; accumulates the weights' gradients.
  void backward(const Compute& c, const Rope& rope, std::int64_t B, std::int64_t T,
                const tensor::Tensor& dout, const tensor::Tensor& x, const AttentionActs& a,
                const AttentionScratch& s, const tensor::Tensor& dx) const;

 private:
  /// (N, H*D), (N, KV*D), (N, KV*D) named prefix + "q", "k", "v".
  void take_qkv(tensor::Arena& arena, const std::string& prefix, std::int64_t N, tensor::Tensor& q,
                tensor::Tensor& k, tensor::Tensor& v) const;
  void unfused_forward(const Compute& c, std::int64_t B, std::int64_t T,
                       const AttentionActs& a) const;
  void cached_forward(const Compute& c, std::int64_t T, const AttentionActs& a,
                      const KVCache& cache) const;
  void unfused_backward(const Compute& c, std::int64_t B, std::int64_t T, const AttentionActs& a,
                        const AttentionScratch& s) const;

  std::string prefix_;
  std::int64_t C_, H_, KV_, D_;
  float out_std_;
  float scale_;      // 1 / sqrt(D)
  int kv_replicas_;  // ranks of the tensor group holding this rank's key/value heads
  std::size_t q_ = 0, k_ = 0, v_ = 0, o_ = 0;
};

}  // namespace dst::model
