#pragma once
/// \file language_model.hpp
/// The language model a run trains, with explicit forward and backward: a DeepSeek
/// decoder, dense (DeepSeek-LLM, Llama-style) or DeepSeek-V2/V3 (latent attention,
/// DeepSeekMoE blocks, the multi-token prediction module):
///   embedding -> L x [x += attn(rmsnorm(x)); x += mlp(rmsnorm(x))] -> rmsnorm -> head
/// attn: causal self-attention with rotary embeddings (MHA, GQA, or latent attention);
/// mlp: SwiGLU, or DeepSeekMoE; loss: cross-entropy with an ignore index.
/// The layers are those of model/transformer.hpp (one class per layer kind in
/// model/layers/); this class owns the buffers of a training micro-batch and runs them,
/// whole or as a pipeline stage, on this rank's tensor and expert slices. Each call that
/// runs a micro-batch returns its result (MicroBatchResult).
///
/// Every buffer comes from the config, sized once: parameters and gradients in the
/// ParamStore, activations kept for backward in one arena, backward scratch in another.
/// Constructing the model in Arena::Mode::plan runs the same layout code and allocates
/// nothing: that is how `dstrain check` sizes a 67B model.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "config/run_config.hpp"
#include "model/layers/head.hpp"
#include "model/layers/moe_dispatch.hpp"
#include "model/param_store.hpp"
#include "model/stage.hpp"
#include "tensor/arena.hpp"
#include "tensor/context.hpp"

namespace dst::model {

class ExpertParallel;  // layers/moe_dispatch.hpp
class TensorParallel;  // layers/tensor_parallel.hpp

/// Bytes a model instance takes, by kind (from the layout pass).
struct ModelMemory {
  std::uint64_t parameters = 0;
  std::uint64_t gradients = 0;
  /// Kept from forward for backward, one micro-batch (MoE blocks' host routing included).
  std::uint64_t activations = 0;
  /// training.recompute: the activations the blocks share and the backward refills block
  /// by block (full: one block's record but its input; selective: one layer's attention
  /// probabilities); 0 for none.
  std::uint64_t recompute = 0;
  std::uint64_t workspace = 0;  ///< backward scratch and RoPE tables
};

/// What the forward (and backward) of one micro-batch produced, returned by the call that
/// ran it.
struct MicroBatchResult {
  /// The sum of the per-token losses over the targets that are not ignored, and their
  /// count (0 and 0 on a pipeline stage without the head).
  double loss_sum = 0.0;
  std::int64_t valid_tokens = 0;
  /// Multi-token prediction (model.mtp_depth 1): its loss sum over its valid targets
  /// (tokens t+2) and their count; computed along with the main loss, not part of it.
  double mtp_loss_sum = 0.0;
  std::int64_t mtp_tokens = 0;
  /// DeepSeekMoE: the sequence-wise balance loss of each MoE block run (this stage's, in
  /// order; the MTP module's block last), summed over the micro-batch's sequences (each
  /// sequence's alpha sum_i f_i P_i, layers/moe_router.hpp). forward_backward's gradients
  /// include it with weight grad_scale x seq_len per sequence.
  std::vector<double> aux_losses;
  /// Wall time of the forward and the backward, in seconds (the phase timers).
  double forward_seconds = 0.0;
  double backward_seconds = 0.0;

  /// The balance losses summed from 0 in order.
  double aux_loss() const {
    double sum = 0.0;
    for (const double a : aux_losses)
      sum += a;
    return sum;
  }
};

/// training.precision -> the storage type the model computes with (docs/precision.md).
DType storage_type(config::Precision precision);

/// How a LanguageModel is built beyond its shape; the defaults are a one-rank f32 model on the
/// host holding every block.
struct ModelOptions {
  /// The back end whose memory holds the parameters, gradients and activations.
  tensor::ExecContext ctx;
  /// The element type parameters and activations are stored in for compute
  /// (training.precision: f32 | bf16 | f16). Every buffer stays f32; for bf16 and f16 the
  /// values are rounded to the storage type where a 16-bit back end would store them
  /// (docs/precision.md), and the forward/backward read a rounded compute copy of the fp32
  /// master parameters (refresh_compute_params()). f32 computes on the master parameters
  /// directly.
  DType storage = DType::f32;
  /// false (debug.deterministic) allows kernels whose results may differ in the last bits
  /// from run to run: the fused attention of the CUDA back end (cuDNN SDPA, whose backward
  /// accumulates with atomics), used where it supports the shape and the storage type.
  bool deterministic = true;
  /// See ParamStore: memory the gradients and parameters live in (the data group's
  /// shared-memory buffers, ZeRO stage 2's untouched pages), else the store's own.
  float* gradient_memory = nullptr;
  float* param_memory = nullptr;
  /// training.recompute: which activations are not kept but recomputed in backward; the
  /// losses and gradients are the same bit for bit, only the memory (memory()) and the
  /// backward's time differ.
  config::Recompute recompute = config::Recompute::none;
  /// ZeRO stage >= 1 with bf16/fp16: the fp32 master parameters are kept outside the model
  /// (each data rank's optimizer holds its shard of them), and the parameter buffer
  /// (params()) *is* the compute copy: no second parameter-sized buffer;
  /// refresh_compute_params() rounds it in place, but for the MoE routers' gate weights
  /// and correction biases, which stay the master's fp32 values (the router computes in
  /// fp32 from the master's, Moe::forward). Nothing changes for f32.
  bool master_outside = false;
  /// The chunks of blocks this rank holds (model/stage.hpp rank_chunks: a pipeline stage's
  /// one, or several under the interleaved schedule, each with its own records).
  std::vector<StageBlocks> chunks{StageBlocks::whole()};
  /// This rank's tensor-parallel slice of the layers (layers/tensor_parallel.hpp);
  /// set_tensor_parallel() gives the group.
  TensorSlice tp;
  /// This rank's expert slice (its routed experts only, layers/moe_dispatch.hpp);
  /// set_expert_parallel() gives the group, which a forward then needs.
  ExpertSlice ep;
};

class LanguageModel {
 public:
  /// A model for micro-batches of `batch` sequences of `seq_len` tokens, laid out (plan)
  /// or allocated per `mode`, built as `options` says.
  LanguageModel(const config::ModelSection& m, std::int64_t batch, std::int64_t seq_len,
                tensor::Arena::Mode mode, const ModelOptions& options = {});
  ~LanguageModel();
  LanguageModel(const LanguageModel&) = delete;
  LanguageModel& operator=(const LanguageModel&) = delete;

  ParamStore& params() { return *params_; }
  const ParamStore& params() const { return *params_; }
  ModelMemory memory() const;
  /// The storage type of parameters and activations for compute (f32, bf16 or f16).
  DType storage() const;
  /// True when attention runs fused (kernels::fused_attention_*), not as products and
  /// a softmax over the (T, T) scores.
  bool fused_attention() const;
  /// Copies the fp32 master parameters (params()) into the compute copy, rounded to the
  /// storage type. Call after every change of the master parameters (initialisation, an
  /// optimizer step, a restore) and before the next forward. Nothing to do for f32.
  /// With the master outside (constructor): rounds params() in place, which the caller
  /// has filled with master values (initialisation, a restore).
  void refresh_compute_params();
  /// With the master outside: the compute copy of the flat-buffer elements
  /// [first, last) from `master` (elements [first, last) of the master, host or device
  /// memory as the buffers), rounded: a rank's shard after its optimizer step, before the
  /// all-gather of the compute copy. Throws dst::Error for a model without the master
  /// outside or a range outside the buffer.
  void refresh_compute_params(const float* master, std::size_t first, std::size_t last);
  std::int64_t batch() const { return B_; }
  std::int64_t seq_len() const { return T_; }

  /// Loss over a micro-batch: tokens, targets (B, T) i32, host memory: its result (the
  /// loss sum over non-ignored targets and their count, the MTP and balance losses, the
  /// forward's time). Keeps activations and the logits (logits()) but computes no gradient.
  MicroBatchResult forward(const std::int32_t* tokens, const std::int32_t* targets);

  /// Forward and backward: gradients of grad_scale * (sum of token losses) are
  /// *accumulated* into the gradient buffer (zero it with params().zero_grads() at the
  /// start of an optimizer step). The trainer passes grad_scale = 1 / (tokens in the
  /// global batch), so gradients are those of the global mean loss. Returns the result, the
  /// backward's time included.
  /// `on_ready(offset)`, if given, is called during backward each time the gradients of
  /// every parameter at flat-buffer offsets >= offset are final for this micro-batch
  /// (after the head, twice per block from the last block down, and 0 at the end): the
  /// trainer starts the all-reduce of finished buckets there and polls those in flight.
  MicroBatchResult forward_backward(const std::int32_t* tokens, const std::int32_t* targets,
                                    float grad_scale,
                                    const std::function<void(std::size_t)>& on_ready = {});

  // --- a pipeline stage (constructed with a StageBlocks; model/stage.hpp) ----------------
  // A record (`slot` below) is one chunk's activations of one micro-batch in flight:
  // record(chunk, micro); with one chunk, record `slot` is slot.
  /// The chunks of blocks this model holds, resolved (the whole model: one, [0, n_layers),
  /// both ends).
  const std::vector<StageBlocks>& chunks() const;
  /// The record chunk `chunk` keeps micro-batch `micro` in (its records in turn: micro mod
  /// its slots). Throws dst::Error for a chunk it does not hold.
  std::size_t record(int chunk, std::int64_t micro) const;
  /// (N, C) (this rank's N / T rows under sequence parallelism) the input of the stage's first
  /// block in record `slot`: a stage without the embedding receives its input here before
  /// stage_forward().
  tensor::Tensor stage_input(std::size_t slot) const;
  /// (N, C) (under sequence parallelism this rank's rows) the output of the stage's last block in
  /// record `slot` after stage_forward() (a stage without the head: what it sends on).
  tensor::Tensor stage_output(std::size_t slot) const;
  /// (N, C) (under sequence parallelism this rank's rows) the gradient of the residual stream:
  /// before stage_backward() of a stage without the head, d(loss)/d(its output), filled by the
  /// caller; after it, on a stage without the embedding, d(loss)/d(its input).
  tensor::Tensor stage_gradient() const;
  /// The stage's forward of one micro-batch into record `slot`: the embedding of `tokens`
  /// on the first stage (else from stage_input(slot)), the blocks, and on the last stage
  /// the head and the loss against `targets` (both (B, T) i32, host memory; each read only
  /// where the stage needs it), with the gradient of grad_scale x the loss sum in place
  /// when `with_gradient` (the last stage keeps one record: its backward follows at once).
  /// Returns the stage's result: the loss sum and its count (0 without the head), the MTP
  /// loss (with its gradient likewise), this stage's balance-loss terms and the time.
  MicroBatchResult stage_forward(std::size_t slot, const std::int32_t* tokens,
                                 const std::int32_t* targets, float grad_scale, bool with_gradient);
  /// The stage's backward of the micro-batch in record `slot` (after its stage_forward
  /// with the gradient): the head's on the last stage, else from stage_gradient(); the
  /// blocks; the embedding's on the first stage. Gradients accumulate; on_ready as
  /// forward_backward's (over this stage's flat buffer). Returns its wall time in seconds.
  double stage_backward(std::size_t slot, const std::function<void(std::size_t)>& on_ready = {});

  /// Logits (B*T, V) of the last forward() (overwritten by forward_backward's gradient).
  tensor::Tensor logits() const;

  // --- DeepSeekMoE (model.n_routed_experts > 0) -------------------------------------------
  /// MoE blocks and routed experts per block (0, 0 for a dense model).
  std::int64_t moe_blocks() const;
  std::int64_t moe_experts() const;
  /// Tokens routed to each expert since the last reset_moe_loads(), (moe_blocks() x
  /// moe_experts()) block-major, summed over the activation records (a stage's slots).
  std::vector<double> moe_loads() const;
  void reset_moe_loads();
  /// Auxiliary-loss-free balancing after an optimizer step: every MoE block's correction
  /// bias moves by Moe::update_bias from `loads` (as moe_loads(), counted over the whole
  /// data group) at `rate`; then the compute copy is refreshed (with the master outside the
  /// biases are the buffer's own fp32 values: the caller puts them into its master).
  void update_moe_bias(const std::vector<double>& loads, double rate);
  /// The flat-buffer offset of every MoE block's correction bias (n_routed_experts fp32
  /// each), in moe_bias()'s order; empty when the blocks have none (softmax routers).
  std::vector<std::size_t> moe_bias_offsets() const;
  /// The correction biases (moe_blocks() x moe_experts()), block-major (metrics).
  std::vector<float> moe_bias() const;
  /// Expert parallelism (parallel.expert > 1): the MoE layers' routed products run over
  /// the expert group of `ep` (layers/moe_dispatch.hpp), every forward and backward then
  /// collective over it; nullptr: every expert on this rank (the default). Not owned.
  /// Throws dst::Error if the model was built for an expert slice (ExpertSlice) that
  /// `ep`'s rank and size do not match.
  void set_expert_parallel(ExpertParallel* ep);
  /// Tensor parallelism: the group whose ranks hold the other slices of a model built with
  /// a TensorSlice (its rank and size must match); every forward and backward is then
  /// collective over it. Not owned.
  void set_tensor_parallel(TensorParallel* tp);
  /// Node-limited routing (model.moe.max_nodes_per_token): the node of each routed expert
  /// (moe_experts() entries, ids 0 .. nodes - 1; expert_nodes() below makes it); empty:
  /// every expert on one node, no limit (the default). Throws dst::Error if M nodes
  /// cannot hold top-k experts (Moe::check_expert_nodes).
  void set_expert_nodes(std::vector<std::int32_t> expert_node);
  /// Rows dropped by the experts' capacity (model.moe.capacity_factor) since the last
  /// reset_moe_loads(), summed over the MoE blocks (counted forwards only).
  double moe_dropped() const;
  // The MoE functions above count the multi-token prediction module's block, when it is an
  // MoE block, after the model's blocks. A pipeline stage counts its own blocks only (its
  // balance loss is stage_forward's, with the gradient in stage_backward like
  // forward_backward's).

  // --- multi-token prediction (model.mtp_depth 1, layers/multi_token_prediction.hpp) ------
  bool has_mtp() const;
  /// The weight of each MTP token's loss in forward_backward's gradients, relative to a main
  /// token's: the gradients are those of grad_scale x (main loss sum + ratio x MTP loss
  /// sum). Starts at model.mtp_loss_weight; the trainer sets mtp_loss_weight x (main target
  /// tokens / MTP target tokens of the global batch) each step, so that the objective is
  /// the main mean + mtp_loss_weight x the MTP mean. Throws dst::Error for a negative or
  /// non-finite ratio.
  void set_mtp_loss_scale(double ratio);
  /// The MTP module's logits (B*T, V) of the last forward() (its gradient after
  /// forward_backward); empty without the module.
  tensor::Tensor mtp_logits() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<ParamStore> params_;
  std::int64_t B_;
  std::int64_t T_;
};

}  // namespace dst::model
