#pragma once
/// \file kernels.hpp
/// The kernel interface: one function per operation, forward and backward, over Tensors
/// and an ExecContext. The context's back end decides who runs it: the Kokkos kernels
/// (kernels/kokkos/, portable, the reference) or the native CUDA kernels (kernels/cuda/,
/// DSTRAIN_ENABLE_CUDA). Kernels never allocate; every buffer is passed in.
///
/// Conventions: N = B*T rows (tokens), C = d_model, F = ffn_dim, V = vocab, H heads of D
/// dims. All float tensors are f32 for now; token ids are i32. "Writes" overwrites the
/// output; "accumulates" adds to it (gradient buffers that several uses share: weight
/// gradients across micro-batches, the residual stream's gradient).

#include <cstdint>

#include "tensor/context.hpp"
#include "tensor/tensor.hpp"

namespace dst::kernels {

using tensor::ExecContext;
using tensor::Tensor;

// --- embedding -------------------------------------------------------------------------
/// Writes out[n, :] = wte[tokens[n], :].  tokens (N) i32, wte (V, C), out (N, C).
/// Throws dst::Error if a token id is outside [0, V) (checked on the host before launch).
void embedding_forward(const ExecContext& ctx, const Tensor& tokens, const Tensor& wte,
                       const Tensor& out);
/// Accumulates dwte[tokens[n], :] += dout[n, :], in a fixed order (deterministic).
void embedding_backward(const ExecContext& ctx, const Tensor& tokens, const Tensor& dout,
                        const Tensor& dwte);

// --- RMSNorm ---------------------------------------------------------------------------
/// Writes rstd[n] = 1 / sqrt(mean_c x[n, c]^2 + eps) and out = x * rstd * w.
/// x, out (N, C); w (C); rstd (N).
void rmsnorm_forward(const ExecContext& ctx, const Tensor& x, const Tensor& w, float eps,
                     const Tensor& out, const Tensor& rstd);
/// Accumulates dx (N, C) and dw (C) from dout (N, C), x, w and the forward's rstd.
/// dw's reduction over rows runs in a fixed order (deterministic).
void rmsnorm_backward(const ExecContext& ctx, const Tensor& dout, const Tensor& x, const Tensor& w,
                      const Tensor& rstd, const Tensor& dx, const Tensor& dw);

// --- rotary embeddings (rotate-half convention, as Llama / DeepSeek-LLM) ---------------
/// Writes the tables cos, sin (T, D/2): angle(t, i) = t * theta^(-2i / D).
void rope_tables(const ExecContext& ctx, double theta, const Tensor& cos, const Tensor& sin);
/// In place on x (B, T, H, D): for i < D/2, (x_i, x_{i+D/2}) is rotated by angle(t, i).
void rope_forward(const ExecContext& ctx, const Tensor& x, const Tensor& cos, const Tensor& sin);
/// In place on dx (B, T, H, D): the transpose (inverse) rotation.
void rope_backward(const ExecContext& ctx, const Tensor& dx, const Tensor& cos, const Tensor& sin);

// --- rotary embeddings, interleaved pairs (DeepSeek-V2/V3 multi-head latent attention) -
/// In place on the last D = 2 * cos.shape[1] columns of each row of x (B, T, H, W), W >= D
/// (the RoPE part of an MLA query head [nope | rope], or the shared key part of
/// [c_kv | k_pe] with H = 1): for i < D/2 the pair (x_{W-D+2i}, x_{W-D+2i+1}) is rotated by
/// angle(t, i) of rope_tables. The pairs of DeepSeek's reference (complex multiplication)
/// and of transformers' DeepseekV2; transformers' DeepseekV3 (rope_interleave) writes the
/// same rotated pairs de-interleaved, [evens | odds], for queries and keys alike, which
/// leaves every query-key dot product, and so the logits and gradients, the same.
void rope_interleaved_forward(const ExecContext& ctx, const Tensor& x, const Tensor& cos,
                              const Tensor& sin);
/// In place on dx (B, T, H, W), the same columns: the transpose (inverse) rotation.
void rope_interleaved_backward(const ExecContext& ctx, const Tensor& dx, const Tensor& cos,
                               const Tensor& sin);

// --- attention softmax -----------------------------------------------------------------
/// Writes probs[b, h, i, j] = softmax over j <= i of scale * scores[b, h, i, j]; 0 for j > i.
/// scores, probs (B, H, T, T); probs may alias scores.
void causal_softmax_forward(const ExecContext& ctx, const Tensor& scores, float scale,
                            const Tensor& probs);
/// Writes dscores = scale * probs * (dprobs - sum_j probs * dprobs), 0 above the diagonal.
/// (B, H, T, T); dscores may alias dprobs.
void causal_softmax_backward(const ExecContext& ctx, const Tensor& probs, const Tensor& dprobs,
                             float scale, const Tensor& dscores);

/// How the unfused causal attention (the products of blas::small_gemm_strided_batched
/// around causal_softmax_*) is best grouped on ctx's back end: the model asks this instead
/// of naming back ends. Every grouping gives the same bits: each product and each row's
/// softmax is the same in any order, and each gradient that sums over heads and query
/// blocks sums them in the same order.
struct AttentionGrouping {
  /// One (sequence, head) at a time: on a host core that head's (T, T) probabilities
  /// (256 KiB at T = 256) stay in cache from the scores product through the softmax to
  /// P x V, and in backward the score gradients never leave it; in one group the
  /// B x H x T x T floats (8 MiB for tiny) would stream through memory between the products
  /// and the softmax. False: every sequence and head in one group (a GPU, where each
  /// launch costs more than it would save).
  bool one_head_at_a_time = false;
  /// Query rows per block: block [r0, r1) attends to keys [0, r1) only, so the products
  /// skip the masked upper triangle (about 5/8 of the T x T work at four blocks; the
  /// model-FLOP count keeps the full matrix, docs/performance.md). The entries beyond r1
  /// are never computed; the softmax kernels never read them and write zeros there, so
  /// P x V and every backward product see the same zeros as a full product. 0: the whole
  /// sequence in one product per head (a GPU, where a launch costs more than the masked
  /// work it would skip).
  std::int64_t query_block = 0;
};
/// The grouping for ctx's back end. Never throws.
AttentionGrouping attention_grouping(const ExecContext& ctx);

// --- SwiGLU ------------------------------------------------------------------------------
/// Writes out = silu(h1) * h3, silu(x) = x / (1 + exp(-x)).  h1, h3, out (N, F).
void swiglu_forward(const ExecContext& ctx, const Tensor& h1, const Tensor& h3, const Tensor& out);
/// Writes dh1 = dout * h3 * silu'(h1) and dh3 = dout * silu(h1). dh1/dh3 may alias h1/h3.
void swiglu_backward(const ExecContext& ctx, const Tensor& dout, const Tensor& h1, const Tensor& h3,
                     const Tensor& dh1, const Tensor& dh3);

// --- DeepSeekMoE token movement ----------------------------------------------------------
// A token's K chosen experts make K rows of the grouped expert products, sorted by expert
// (model/layers/moe_router.hpp, sort_by_expert): row r belongs to token token[r], and token
// n's slot k is row row[n, k]. The indices are the router's invariant (every row is one
// (token, slot) pair); only gather_rows checks its tokens (it is the embedding's gather).
// No atomics: every output element is summed
// by one thread in slot order, so the results are the same bits on every run, and the
// CUDA back end's equal the Kokkos back end's (d_weights, a reduction, excepted).

/// Writes out[r, :] = x[token[r], :].  x (N, C); token (R) i32; out (R, C). Throws
/// dst::Error naming the first token outside [0, N) and its position (embedding_forward's
/// gather and check, with x as the table).
void gather_rows(const ExecContext& ctx, const Tensor& x, const Tensor& token, const Tensor& out);
/// The transpose of gather_rows, by token: accumulates dx[n, :] += sum_k d_out[row[n, k], :],
/// slots in order k = 0 .. K-1.  d_out (R, C); row (N, K) i32; dx (N, C).
void gather_rows_backward(const ExecContext& ctx, const Tensor& d_out, const Tensor& row,
                          const Tensor& dx);
/// The combine: accumulates out[n, :] += sum_k weights[n, k] * y[row[n, k], :], slots in
/// order.  y (R, C); row (N, K) i32; weights (N, K); out (N, C).
void moe_combine_forward(const ExecContext& ctx, const Tensor& y, const Tensor& row,
                         const Tensor& weights, const Tensor& out);
/// Its backward: writes d_y[row[n, k], :] = weights[n, k] * dout[n, :] and
/// d_weights[n, k] = dout[n, :] . y[row[n, k], :] (summed in double, columns in order).
void moe_combine_backward(const ExecContext& ctx, const Tensor& dout, const Tensor& y,
                          const Tensor& row, const Tensor& weights, const Tensor& d_y,
                          const Tensor& d_weights);

// --- cross-entropy fused with the softmax over the vocabulary --------------------------
/// Writes losses[n] = logsumexp(logits[n, :]) - logits[n, targets[n]], or 0 where
/// targets[n] == ignore_index.  logits (N, V); targets (N) i32; losses (N).
void cross_entropy_forward(const ExecContext& ctx, const Tensor& logits, const Tensor& targets,
                           std::int32_t ignore_index, const Tensor& losses);
/// Forward and backward in one pass over each row: writes losses as above and
/// dlogits[n, :] = grad_scale * (softmax(logits[n, :]) - onehot(targets[n])), 0 for ignored
/// rows. dlogits may alias logits (the logits buffer becomes its gradient).
void cross_entropy_fused(const ExecContext& ctx, const Tensor& logits, const Tensor& targets,
                         std::int32_t ignore_index, float grad_scale, const Tensor& losses,
                         const Tensor& dlogits);

// --- vocabulary slices (tensor parallelism, model/layers/vocab_parallel.hpp) ------------
// A vocabulary of V ids split over a tensor-parallel group: a rank's slice holds ids
// [first, first + count) of the (V, C) table (wte (count, C)) and the same columns of the
// logits (N, count). The group's collectives come between the passes; with a group of one
// (first 0, count V) the results are embedding_* and cross_entropy_*'s bits.

/// out (N, C): row tokens[n] - first of the slice for the tokens it holds, -0.0 for the
/// others (the identity of the group's sum, signed zeros included). Throws dst::Error
/// naming the first token outside [0, vocab) and its position, before writing.
void embedding_slice_forward(const ExecContext& ctx, const Tensor& tokens, const Tensor& wte,
                             std::int64_t first, std::int64_t vocab, const Tensor& out);
/// dwte (count, C) += the dout rows of the tokens the slice holds, in token order (the
/// slices side by side are embedding_backward's bits on the whole table). Throws as above.
void embedding_slice_backward(const ExecContext& ctx, const Tensor& tokens, const Tensor& dout,
                              std::int64_t first, std::int64_t vocab, const Tensor& dwte);
/// The cross-entropy's first pass: keys (N) i32 = each row's maximum over the slice as an
/// order key (an int32 whose order is the floats', so that an integer max over the group
/// is the exact maximum of the whole row, NaN and signed zeros included). Throws
/// dst::Error naming the first target outside [0, vocab) that is not ignore_index.
void cross_entropy_slice_max(const ExecContext& ctx, const Tensor& logits, const Tensor& targets,
                             std::int32_t ignore_index, std::int64_t vocab, const Tensor& keys);
/// Its second pass, from the group's maxima `keys`: sums (N, 2) f64 = per row the sum of
/// exp(l - max) over the slice (double, cross_entropy_forward's lane order) and the
/// target's logit if the slice holds it (-0.0 otherwise); (0, 0) for ignored rows.
/// keep_exp: the logits become exp(l - max) (the fused kernel's intermediate).
void cross_entropy_slice_sums(const ExecContext& ctx, const Tensor& logits, const Tensor& keys,
                              const Tensor& targets, std::int32_t ignore_index, std::int64_t first,
                              bool keep_exp, const Tensor& sums);
/// Its last pass, from the group's sums: losses[n] = log(sum) + max - target logit (0 for
/// ignored rows); with_gradient (after keep_exp): the logits become grad_scale x (softmax -
/// onehot(target)) on the slice's columns, 0 for ignored rows.
void cross_entropy_slice_finish(const ExecContext& ctx, const Tensor& logits, const Tensor& keys,
                                const Tensor& sums, const Tensor& targets,
                                std::int32_t ignore_index, std::int64_t first, float grad_scale,
                                bool with_gradient, const Tensor& losses);

// --- elementwise -------------------------------------------------------------------------
/// Writes out = a + b (same shapes; out may alias a or b). The residual connection.
void add(const ExecContext& ctx, const Tensor& a, const Tensor& b, const Tensor& out);
/// Accumulates y += x (same shapes).
void accumulate(const ExecContext& ctx, const Tensor& x, const Tensor& y);
/// Writes t = 0.
void zero(const ExecContext& ctx, const Tensor& t);
/// In place x *= factor (any shape, f32): gradient clipping or loss-scale removal when
/// they are applied on their own rather than folded into the optimizer (AdamWHyper).
void scale(const ExecContext& ctx, const Tensor& x, float factor);

// --- casts: emulated low-precision storage ----------------------------------------------
/// In place on x (any shape, f32): every element becomes the nearest value of the storage
/// type `storage` (round to nearest, ties to even, core/bf16.hpp), still held as f32:
///   f32  - nothing (the identity; no kernel runs);
///   bf16 - 8 significant bits, float's range;
///   f16  - 11 significant bits, |x| >= 65520 becomes +-inf, |x| < 2^-14 subnormal.
/// NaN stays NaN. This is how the host build emulates a back end that stores parameters
/// and activations in 16 bits and computes in fp32 (training.precision bf16 | fp16,
/// docs/precision.md): LanguageModel calls it at each point where such a back end would
/// store. Throws dst::Error for any other storage type.
void round_to_storage(const ExecContext& ctx, const Tensor& x, DType storage);

// --- norms (gradient clipping, non-finite detection) ------------------------------------
/// sum_i x[i]^2 over every element of x (any shape, f32), accumulated in double: each
/// square of a float is exact in double, and the sum of 1e9 terms keeps ~1e-7 relative
/// accuracy, where a float sum would lose everything past ~2^24 terms. The order is fixed
/// (chunks of consecutive elements summed in a fixed lane order, chunk sums combined in
/// the back end's reduction order), so a back end with a fixed thread count returns the
/// same bits on every run and every rank. NaN and Inf propagate (NaN stays NaN).
double sum_of_squares(const ExecContext& ctx, const Tensor& x);
/// The same sum, bit for bit, written to out[index] (out: (count) f64 in ctx's memory)
/// without waiting for it: nothing is copied to the host, so on a GPU the sums of a whole
/// gradient buffer's tensors cost one stream synchronisation (the caller's one copy of
/// out), not one each. An empty x writes 0. Throws dst::Error for an index outside out.
void sum_of_squares_into(const ExecContext& ctx, const Tensor& x, const Tensor& out,
                         std::int64_t index);
/// Position (flat index) of the first NaN or +-Inf element of x (f32), or -1 when all are
/// finite. Decided on the bits, so it raises no floating-point exception; a min reduction,
/// so the answer does not depend on the order.
std::int64_t first_nonfinite(const ExecContext& ctx, const Tensor& x);
/// The same scan without waiting for an answer: if x (f32) has a NaN or +-Inf, flag[0]
/// (one u64 in ctx's memory) becomes min(flag[0], offset + its first position). Nothing
/// is copied to the host, so on a GPU a series of scans (the gradient buckets of one step)
/// costs no stream synchronisation; the caller reads flag once at the end. Start a series
/// with flag = UINT64_MAX ("none"). A min, so the answer does not depend on the order.
void first_nonfinite_min(const ExecContext& ctx, const Tensor& x, std::uint64_t offset,
                         const Tensor& flag);

// --- AdamW -------------------------------------------------------------------------------
/// Hyper-parameters of one AdamW step (host scalars; double so the bias corrections of
/// late steps are computed without float round-off).
struct AdamWHyper {
  double lr = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  ///< 0 for tensors that are not decayed (norm weights)
  std::int64_t step = 1;      ///< 1-based: the step being taken (bias correction)
  double grad_scale = 1.0;    ///< multiplies the gradient first: 1 / loss scale x clip factor
};
/// One AdamW step (Loshchilov & Hutter, decoupled weight decay) over a contiguous range,
/// exactly the update of PyTorch's torch.optim.AdamW (single-tensor path), in its order:
///   g = grad_scale * grads
///   params *= 1 - lr * weight_decay            (decay first, from the old parameters)
///   m = lerp(m, g, 1 - beta1)                  (= beta1 m + (1 - beta1) g)
///   v = beta2 v + (1 - beta2) g^2
///   params -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
/// i.e. mhat / (sqrt(vhat) + eps) with eps added after the square root of the bias-
/// corrected v. The per-step scalars are computed in double and rounded to float once;
/// the element arithmetic is float, like PyTorch's for f32 parameters.
/// params, grads, m, v: (n) f32 each (any shape, all equal); m and v are the fp32 moments.
/// grads is only read. Throws dst::Error for a step < 1 or hyper-parameters outside their
/// ranges (lr >= 0, beta in [0, 1), eps > 0, weight_decay >= 0, all finite).
void adamw_step(const ExecContext& ctx, const Tensor& params, const Tensor& grads, const Tensor& m,
                const Tensor& v, const AdamWHyper& h);

// --- fused attention (cuDNN SDPA; CUDA back end only) ----------------------------------
// Causal attention in one pass, forward and backward, through cuDNN's fused flash-attention
// engines (lib/kernels/cuda/attention_cudnn.cpp). There is no Kokkos version: on the Kokkos
// back end, in builds without cuDNN and for f32 math, fused_attention_supported() is false and
// the model keeps the unfused path (blas::gemm_strided_batched + causal_softmax_*). Storage
// stays f32: the CUDA back end converts the inputs to ctx.math (bf16 or f16) in its scratch,
// runs cuDNN with 16-bit inputs and outputs and fp32 accumulation, and converts the results
// back. So out, dq, dk and dv carry ctx.math's precision (8 or 11 significant bits), and the
// backward is not bitwise deterministic (cuDNN accumulates dQ with atomics).
// Layout: (B, T, H, D) row-major for q, out and their gradients, (B, T, KV, D) for k, v and
// theirs; H must be a multiple of KV (query head h reads key/value head h / (H / KV)).

/// Whether fused_attention_forward/backward can run for this shape on ctx's back end:
/// false on the Kokkos back end, in builds without cuDNN, when math is f32 (cuDNN SDPA
/// runs in bf16/f16 only), or when cuDNN declines the shape (decided once per shape by
/// building the graph; cached). Never throws for "not supported".
bool fused_attention_supported(const ExecContext& ctx, std::int64_t B, std::int64_t T,
                               std::int64_t H, std::int64_t KV, std::int64_t D);
/// Causal attention: out[b,t,h,:] = sum_{s<=t} softmax_s(scale * q[b,t,h,:].k[b,s,h/(H/KV),:])
/// v[b,s,kh,:]. q, out (B,T,H,D) f32 (values already rounded to ctx.math); k, v (B,T,KV,D) f32;
/// stats (B,H,T) f32 (16-byte aligned) receives the softmax log-sum-exp rows the backward
/// needs (natural log, of the scaled scores). Scratch comes from the CUDA back end's
/// per-stream scratch (kernels/cuda/detail/scratch.hpp). Throws dst::Error for wrong shapes
/// or dtypes, a non-finite scale, a context other than CUDA with bf16/f16 math, or a shape
/// fused_attention_supported() rejects (the message carries cuDNN's reason).
void fused_attention_forward(const ExecContext& ctx, const Tensor& q, const Tensor& k,
                             const Tensor& v, float scale, const Tensor& out, const Tensor& stats);
/// Writes dq (B,T,H,D), dk, dv (B,T,KV,D) from dout (B,T,H,D) and the forward's q,k,v,out,stats
/// (same ctx.math and scale as the forward). Same errors as the forward.
void fused_attention_backward(const ExecContext& ctx, const Tensor& q, const Tensor& k,
                              const Tensor& v, const Tensor& out, const Tensor& dout,
                              const Tensor& stats, float scale, const Tensor& dq, const Tensor& dk,
                              const Tensor& dv);

}  // namespace dst::kernels
