#pragma once
/// \file schema.hpp
/// The deck schema: the one table that binds every RunConfig field to its dotted key
/// path, documentation and allowed values. Parsing, unknown-key detection, range checks,
/// to_yaml, schema_keys(), deck_reference_markdown() and operator== are all visitors over
/// it, so adding a key here is the only change a new deck key needs (plus the field in
/// run_config.hpp).
///
/// A visitor provides
///   void section(const char* path, const char* doc);
///   template <class T> void field(const char* path, const Spec& spec, T&... fields);
/// where T is a scalar, a list, std::string, ResumeSetting, or an enum with EnumNames
/// (core/enum_names.hpp), whose names are the key's allowed values.
/// The visit functions take one or more sections of the same type (const or not) and
/// pass the matching field of each, so a two-config visitor (operator==) uses the same
/// table as a one-config one.

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <vector>

#include "config/run_config.hpp"

namespace dst::config::detail {

/// What a key accepts beyond its C++ type. Built with chained setters:
/// `Spec("doc").at_least(1)`.
struct Spec {
  const char* doc = "";
  std::optional<double> min;  ///< lower bound (inclusive unless min_open)
  std::optional<double> max;  ///< upper bound (inclusive unless max_open)
  bool min_open = false;
  bool max_open = false;
  /// A string key limited to these names (model.preset). Enumerated settings are enum
  /// types instead, whose names come from their EnumNames table.
  std::vector<const char*> choices;
  bool allow_empty = false;    ///< string: "" (or null) is allowed
  bool auto_zero = false;      ///< integer: `auto` is accepted and stored as 0
  bool increasing = false;     ///< list: strictly increasing elements
  const char* note = nullptr;  ///< extra text for the "allowed" column

  explicit Spec(const char* d) : doc(d) {}
  Spec& at_least(double v) {
    min = v;
    return *this;
  }
  Spec& above(double v) {
    min = v;
    min_open = true;
    return *this;
  }
  Spec& at_most(double v) {
    max = v;
    return *this;
  }
  Spec& below(double v) {
    max = v;
    max_open = true;
    return *this;
  }
  Spec& one_of(std::initializer_list<const char*> c) {
    // push_back, not assignment: GCC 12 warns falsely (-Wnonnull) on the memmove that
    // vector's initializer_list assignment inlines.
    for (const char* s : c)
      choices.push_back(s);
    return *this;
  }
  Spec& empty_ok() {
    allow_empty = true;
    return *this;
  }
  Spec& with_auto() {
    auto_zero = true;
    return *this;
  }
  Spec& strictly_increasing() {
    increasing = true;
    return *this;
  }
  Spec& with_note(const char* n) {
    note = n;
    return *this;
  }
};

// Counts and sizes that end up in `int` (ranks, Layout) are capped at INT32_MAX so the
// narrowing in resolve_layout cannot overflow.
inline constexpr double kIntMax = std::numeric_limits<std::int32_t>::max();
// Timeouts end up in std::chrono durations (nanosecond int64 holds ~292 years); 1e6 s
// (11.6 days) is far beyond any sane collective deadline and far inside that range.
inline constexpr double kMaxTimeoutS = 1.0e6;

template <class V, class... S>
void visit_run(V& v, S&... s) {
  v.section("run", "Identity of the run and where it writes.");
  v.field("run.name", Spec("Name of the run, used in logs and metrics."), s.name...);
  v.field(
      "run.seed",
      Spec("The one seed every random stream derives from.").with_note("0 to 18446744073709551615"),
      s.seed...);
  v.field("run.output_dir",
          Spec("Directory for metrics, checkpoints and the resolved deck (created if missing)."),
          s.output_dir...);
}

template <class V, class... S>
void visit_model(V& v, S&... s) {
  v.section("model",
            "Model shape. `preset` fills every other key; keys given explicitly win over it.");
  v.field("model.preset",
          Spec("Named model shape that provides the defaults of this section.")
              .one_of({"tiny", "small", "deepseek-1b", "deepseek-llm-7b", "deepseek-llm-67b",
                       "tiny-moe", "deepseek-v2-lite", "deepseek-v3"}),
          s.preset...);
  v.field("model.vocab_size",
          Spec("Vocabulary size (tiny: 256 byte values + 4 special tokens).")
              .at_least(1)
              .at_most(kIntMax),
          s.vocab_size...);
  v.field("model.d_model",
          Spec("Hidden size; n_heads must divide it into an even head dim.")
              .at_least(1)
              .at_most(kIntMax),
          s.d_model...);
  v.field("model.n_layers", Spec("Number of transformer blocks.").at_least(1).at_most(kIntMax),
          s.n_layers...);
  v.field("model.n_heads", Spec("Attention (query) heads.").at_least(1).at_most(kIntMax),
          s.n_heads...);
  v.field("model.n_kv_heads",
          Spec("Key/value heads; fewer than n_heads (dividing it) is grouped-query attention.")
              .at_least(1)
              .at_most(kIntMax),
          s.n_kv_heads...);
  v.field("model.ffn_dim",
          Spec("Inner size of the SwiGLU feed-forward block.").at_least(1).at_most(kIntMax),
          s.ffn_dim...);
  v.field(
      "model.max_seq_len",
      Spec("Longest sequence the model supports (RoPE table size).").at_least(1).at_most(kIntMax),
      s.max_seq_len...);
  v.field("model.rope_theta", Spec("RoPE base frequency.").above(0), s.rope_theta...);
  v.field("model.norm_eps", Spec("RMSNorm epsilon.").above(0), s.norm_eps...);
  v.field("model.tie_embeddings", Spec("Share the input embedding with the output projection."),
          s.tie_embeddings...);
  v.field("model.q_lora_rank",
          Spec("MLA: rank of the query compression (q_a_proj); 0 = a full q_proj.")
              .at_least(0)
              .at_most(kIntMax),
          s.q_lora_rank...);
  v.field("model.kv_lora_rank",
          Spec("MLA: rank of the compressed key/value latent; 0 = standard attention, > 0 = "
               "multi-head latent attention in every block.")
              .at_least(0)
              .at_most(kIntMax),
          s.kv_lora_rank...);
  v.field("model.qk_nope_head_dim",
          Spec("MLA: per-head query/key dims without RoPE.").at_least(0).at_most(kIntMax),
          s.qk_nope_head_dim...);
  v.field("model.qk_rope_head_dim",
          Spec("MLA: per-head query/key dims with RoPE (even; the key part is shared by all "
               "heads).")
              .at_least(0)
              .at_most(kIntMax),
          s.qk_rope_head_dim...);
  v.field("model.v_head_dim", Spec("MLA: per-head value dims.").at_least(0).at_most(kIntMax),
          s.v_head_dim...);
  v.section("model.rope_scaling",
            "RoPE past the pre-training context (Hugging Face's rope_scaling; latent attention "
            "only).");
  v.field("model.rope_scaling.type",
          Spec("none = RoPE as trained; yarn = YaRN (DeepSeek-V2/V3 long context)."),
          s.rope_scaling.type...);
  v.field("model.rope_scaling.factor", Spec("YaRN: context extension factor.").at_least(1),
          s.rope_scaling.factor...);
  v.field("model.rope_scaling.original_max_seq_len",
          Spec("YaRN: the pre-training context (HF original_max_position_embeddings).")
              .at_least(1)
              .at_most(kIntMax),
          s.rope_scaling.original_max_seq_len...);
  v.field(
      "model.rope_scaling.beta_fast",
      Spec("YaRN: rotations over the original context above which a frequency is kept.").above(0),
      s.rope_scaling.beta_fast...);
  v.field("model.rope_scaling.beta_slow",
          Spec("YaRN: rotations below which a frequency is interpolated by factor; < beta_fast.")
              .above(0),
          s.rope_scaling.beta_slow...);
  v.field("model.rope_scaling.mscale",
          Spec("YaRN: mscale of the RoPE tables' factor (0.1 mscale ln(factor) + 1).").at_least(0),
          s.rope_scaling.mscale...);
  v.field("model.rope_scaling.mscale_all_dim",
          Spec("YaRN: its denominator's mscale, and the softmax scale's factor (0.1 "
               "mscale_all_dim ln(factor) + 1)^2; 0 = neither.")
              .at_least(0),
          s.rope_scaling.mscale_all_dim...);
  v.field("model.n_routed_experts",
          Spec("DeepSeekMoE: routed experts per MoE block; 0 = dense MLP in every block.")
              .at_least(0)
              .at_most(kIntMax),
          s.n_routed_experts...);
  v.field("model.n_shared_experts",
          Spec("DeepSeekMoE: shared experts (one SwiGLU of n_shared x moe_intermediate_size).")
              .at_least(0)
              .at_most(kIntMax),
          s.n_shared_experts...);
  v.field("model.num_experts_per_tok",
          Spec("DeepSeekMoE: routed experts each token uses (top-k).").at_least(0).at_most(kIntMax),
          s.num_experts_per_tok...);
  v.field("model.moe_intermediate_size",
          Spec("DeepSeekMoE: inner size of each expert's SwiGLU.").at_least(0).at_most(kIntMax),
          s.moe_intermediate_size...);
  v.field("model.first_k_dense_replace",
          Spec("DeepSeekMoE: the first k blocks keep the dense MLP (ffn_dim).")
              .at_least(0)
              .at_most(kIntMax),
          s.first_k_dense_replace...);
  v.field("model.n_group",
          Spec("DeepSeekMoE: expert groups for group-limited routing (divides n_routed_experts).")
              .at_least(1)
              .at_most(kIntMax),
          s.n_group...);
  v.field(
      "model.topk_group",
      Spec("DeepSeekMoE: groups a token may route to (<= n_group).").at_least(1).at_most(kIntMax),
      s.topk_group...);
  v.field("model.norm_topk_prob",
          Spec("DeepSeekMoE: renormalise the chosen experts' weights to sum to 1."),
          s.norm_topk_prob...);
  v.field("model.routed_scaling_factor",
          Spec("DeepSeekMoE: factor on the routed experts' weights.").above(0),
          s.routed_scaling_factor...);
  v.section("model.moe", "DeepSeekMoE training settings (no Hugging Face config field).");
  v.field("model.moe.score",
          Spec("Router scores: sigmoid (V3, bias-corrected choice) or softmax (V2)."),
          s.moe.score...);
  v.field("model.moe.bias_update_rate",
          Spec("Auxiliary-loss-free balancing: gamma of b_i -= gamma * sign(load_i - mean) "
               "after each step; 0 disables.")
              .at_least(0),
          s.moe.bias_update_rate...);
  v.field("model.moe.seq_aux_loss_alpha",
          Spec("Weight alpha of the sequence-wise balance loss; 0 disables.").at_least(0),
          s.moe.seq_aux_loss_alpha...);
  v.field("model.moe.capacity_factor",
          Spec("Expert capacity factor f: each expert takes at most ceil(f x tokens x top-k / "
               "n_routed_experts) (token, slot) rows of a rank's micro-batch, the rows of the "
               "lowest router scores beyond it dropped (docs/model.md); 0 = dropless.")
              .at_least(0),
          s.moe.capacity_factor...);
  v.field("model.moe.max_nodes_per_token",
          Spec("Node-limited routing (DeepSeek-V3's M): a token's routed experts come from at "
               "most this many nodes of the expert placement (docs/model.md); 0 = off.")
              .at_least(0)
              .at_most(kIntMax),
          s.moe.max_nodes_per_token...);
  v.field("model.mtp_depth",
          Spec("Multi-token prediction modules (DeepSeek-V3): 0 = none; 1 = one more block over "
               "[RMSNorm(Emb(t+1)); RMSNorm(h)] that predicts token t+2 through the shared "
               "embedding and head (docs/model.md); generate skips it.")
              .at_least(0)
              .at_most(1),
          s.mtp_depth...);
  v.field("model.mtp_loss_weight",
          Spec("Weight lambda of the MTP loss: the objective is the main loss + lambda x the MTP "
               "loss, each a mean over its valid targets.")
              .at_least(0),
          s.mtp_loss_weight...);
}

template <class V, class... S>
void visit_data(V& v, S&... s) {
  v.section("data", "Training and validation data.");
  v.field("data.train",
          Spec("Training shards: a glob or a manifest file; empty = not configured.").empty_ok(),
          s.train...);
  v.field("data.valid", Spec("Validation shard(s); empty = no validation data.").empty_ok(),
          s.valid...);
  v.field("data.seq_len",
          Spec("Tokens per training sequence; defaults to model.max_seq_len when not given.")
              .at_least(1)
              .at_most(kIntMax),
          s.seq_len...);
  v.field("data.format",
          Spec("How data.train/valid are stored: hdf5 shards, or plain text files read "
               "with the byte-level vocabulary; auto = text for paths ending in .txt."),
          s.format...);
  v.field("data.text_separator",
          Spec("Text data: a line equal to this separates documents; empty = one document "
               "per file.")
              .empty_ok(),
          s.text_separator...);
}

template <class V, class... S>
void visit_optimizer(V& v, S&... s) {
  v.section("training.optimizer", "The optimizer.");
  v.field("training.optimizer.type", Spec("Optimizer."), s.type...);
  v.field("training.optimizer.lr", Spec("Peak learning rate.").above(0), s.lr...);
  v.field("training.optimizer.betas", Spec("Adam beta1 and beta2.").at_least(0).below(1),
          s.betas...);
  v.field("training.optimizer.eps", Spec("Adam epsilon.").above(0), s.eps...);
  v.field("training.optimizer.weight_decay", Spec("Decoupled weight decay.").at_least(0),
          s.weight_decay...);
}

template <class V, class... S>
void visit_schedule(V& v, S&... s) {
  v.section("training.schedule", "Learning-rate schedule.");
  v.field("training.schedule.type", Spec("Shape of the learning rate after warm-up."), s.type...);
  v.field("training.schedule.warmup_steps",
          Spec("Linear warm-up steps from 0 to the peak; at most training.max_steps.").at_least(0),
          s.warmup_steps...);
  v.field("training.schedule.min_lr_ratio",
          Spec("Final learning rate of cosine/linear decay, as a fraction of the peak.")
              .at_least(0)
              .at_most(1),
          s.min_lr_ratio...);
  v.field("training.schedule.milestones",
          Spec("multistep: fractions of max_steps at which the rate drops; same length as "
               "factors.")
              .above(0)
              .below(1)
              .strictly_increasing(),
          s.milestones...);
  v.field("training.schedule.factors",
          Spec("multistep: the rate after each milestone, as a fraction of the peak.").above(0),
          s.factors...);
  v.field("training.schedule.world_size_scaling",
          Spec("Scale the peak rate by world_size / reference_world_size (linear) or its square "
               "root (sqrt)."),
          s.world_size_scaling...);
  v.field("training.schedule.reference_world_size",
          Spec("World size the peak rate was tuned for.").at_least(1).at_most(kIntMax),
          s.reference_world_size...);
}

template <class V, class... S>
void visit_training(V& v, S&... s) {
  v.section("training", "Steps, batch sizes, precision, optimizer and schedule.");
  v.field("training.max_steps", Spec("Optimizer steps to train for.").at_least(1), s.max_steps...);
  v.field("training.stop_at_step",
          Spec("Stop after this global step with a checkpoint, as if pre-empted, leaving the "
               "schedule (which runs to max_steps) unchanged; 0 = run to max_steps.")
              .at_least(0),
          s.stop_at_step...);
  v.field("training.global_batch_size",
          Spec("Sequences per optimizer step; 0 = micro_batch_size x data ranks x "
               "grad_accum_steps.")
              .at_least(0),
          s.global_batch_size...);
  v.field("training.micro_batch_size",
          Spec("Sequences per rank per micro-step.").at_least(1).at_most(kIntMax),
          s.micro_batch_size...);
  v.field("training.grad_accum_steps",
          Spec("Micro-steps per optimizer step, only when global_batch_size is 0; 0 = derived "
               "from global_batch_size.")
              .at_least(0),
          s.grad_accum_steps...);
  v.field("training.precision",
          Spec("Compute precision of the forward and backward pass: bf16/fp16 store parameters "
               "and activations in 16 bits (emulated on CPUs) with fp32 master weights, moments "
               "and reductions; fp16 adds dynamic loss scaling (docs/precision.md)."),
          s.precision...);
  v.field("training.recompute",
          Spec("Activations the backward recomputes instead of keeping them from the forward: "
               "none; selective = attention's (B, H, T, T) probabilities (Korthikanti et al. "
               "2022); full = everything but each block's input (one more forward of the "
               "blocks); latent attention and DeepSeekMoE blocks too (the recomputed forward "
               "does not count expert loads again). Same gradients bit for bit; generate "
               "ignores it (docs/performance.md)."),
          s.recompute...);
  v.field("training.grad_clip", Spec("Global gradient-norm clip; 0 = no clipping.").at_least(0),
          s.grad_clip...);
  visit_optimizer(v, s.optimizer...);
  visit_schedule(v, s.schedule...);
}

template <class V, class... S>
void visit_parallel(V& v, S&... s) {
  v.section("parallel", "How the ranks are divided and how they talk.");
  v.field("parallel.data",
          Spec("Data-parallel ranks; auto = the world size / parallel.pipeline.")
              .with_auto()
              .at_least(1)
              .at_most(kIntMax),
          s.data...);
  v.field("parallel.tensor",
          Spec("Tensor-parallel ranks: every layer split over groups of this many consecutive "
               "ranks (Megatron-LM's layout: attention by heads, the MLP by hidden columns, "
               "embedding and head by vocabulary rows, a cross-entropy over the split "
               "vocabulary; docs/performance.md, \"tensor parallelism\"). Divides "
               "model.n_heads, ffn_dim and vocab_size, and divides model.n_kv_heads or is a "
               "multiple of it (fewer key/value heads than ranks: each is replicated on "
               "tensor / n_kv_heads ranks, as Megatron-LM does). The world is pipeline x "
               "data x tensor ranks. Latent attention splits by heads too (its latents "
               "replicated); a DeepSeekMoE layer is computed whole on every rank of the group "
               "(its parameters replicated; expert parallelism splits its experts); the MTP "
               "module's block is split as the model's. On host memory only for now: not "
               "with kernels.backend cuda or parallel.backend nccl.")
              .at_least(1)
              .at_most(kIntMax),
          s.tensor...);
  v.field("parallel.sequence_parallel",
          Spec("Sequence parallelism with parallel.tensor > 1 (Korthikanti et al. 2022; "
               "docs/performance.md, \"sequence parallelism\"): each rank of a tensor group "
               "keeps 1 / tensor of the token rows of the residual stream and of the blocks' "
               "norms, and each attention's and MLP's all-reduce becomes an all-gather of its "
               "input and a reduce-scatter of its output (about 25 % more traffic: the backward "
               "gathers the norms' rows again). "
               "parallel.tensor divides training.micro_batch_size x data.seq_len."),
          s.sequence_parallel...);
  v.field("parallel.pipeline",
          Spec("Pipeline-parallel stages: the blocks split into this many consecutive stages, "
               "each on its own ranks (the world is data x pipeline ranks; docs/performance.md, "
               "\"pipeline parallelism\"). At most model.n_layers. Stages hold dense or "
               "DeepSeekMoE blocks (latent attention, expert parallelism within a stage's data "
               "ranks); with tied embeddings or the MTP module the last stage holds a copy of "
               "the embedding table, its gradient summed with the first stage's. Not with "
               "kernels.backend cuda yet.")
              .at_least(1)
              .at_most(kIntMax),
          s.pipeline...);
  v.field("parallel.pipeline_layers",
          Spec("Blocks per pipeline stage, first stage first (it also holds the embedding; the "
               "last the final norm and the head); empty = an even split, the first stages one "
               "more block when n_layers does not divide. parallel.pipeline entries (with "
               "virtual stages, parallel.pipeline x parallel.virtual_stages: one per virtual "
               "stage, in the model's order), summing to model.n_layers.")
              .at_least(1)
              .at_most(kIntMax),
          s.pipeline_layers...);
  v.field("parallel.pipeline_schedule",
          Spec("Order of a stage's forwards and backwards over the step's micro-batches (the "
               "accumulation steps): 1f1b (one forward, one backward; at most P - stage "
               "micro-batches in flight; bubble (P - 1) / micro-batches). interleaved "
               "(Megatron-LM's virtual pipeline): each rank holds parallel.virtual_stages "
               "chunks of blocks, chunk c of rank p being virtual stage c x P + p; bubble "
               "(P - 1) / (virtual_stages x micro-batches), for more activation records and "
               "virtual_stages times the point-to-point messages. interleaved needs "
               "virtual_stages >= 2 and micro-batches a multiple of parallel.pipeline."),
          s.pipeline_schedule...);
  v.field("parallel.virtual_stages",
          Spec("Model chunks per pipeline rank under pipeline_schedule interleaved (V >= 2; 1 "
               "under 1f1b). pipeline x virtual_stages is at most model.n_layers.")
              .at_least(1)
              .at_most(kIntMax),
          s.virtual_stages...);
  v.field("parallel.expert",
          Spec("Expert-parallel ranks (docs/model.md, \"Expert parallelism\"): the routed "
               "experts of every MoE layer are split over groups of this many consecutive data "
               "ranks, tokens dispatched to their experts' ranks by all-to-all; must divide "
               "model.n_routed_experts and the data ranks; 1 = every rank computes every "
               "expert. Each rank stores only its own experts (parameters, gradients, AdamW "
               "moments; their gradients summed over the ranks holding the same ones), "
               "checkpoints every expert whole. Dropless unless model.moe.capacity_factor; "
               "node-limited routing by model.moe.max_nodes_per_token; host memory and the "
               "mpi back end only (the NCCL all-to-all exists, the dispatch on a GPU does not; "
               "shm does not cover per-rank experts yet: parallel.backend auto takes mpi, "
               "shm is refused; on pipeline stages each stage holding an MoE block stores its "
               "own experts). "
               "With parallel.zero_stage > 0 over mpi the own experts' state is sharded over "
               "the ranks holding the same experts (data ranks / expert), the rest over the "
               "data ranks.")
              .at_least(1)
              .at_most(kIntMax),
          s.expert...);
  v.field(
      "parallel.backend",
      Spec("Communication back end of the gradients: auto = nccl when the model runs on "
           "a GPU in an NCCL build and the data group has more than one rank (docs/nccl.md); "
           "shm (gradients summed in one node's shared memory, the optimizer's update shared by "
           "its ranks) when the model runs on the host, the data "
           "group has more than one rank and the job is on one node "
           "(docs/performance.md); else mpi."),
      s.backend...);
  v.field("parallel.bucket_mb", Spec("Gradient all-reduce bucket size in MiB.").above(0),
          s.bucket_mb...);
  v.field("parallel.overlap",
          Spec("Start each gradient bucket's all-reduce during backward as soon as it is "
               "final, polled by a progress thread where MPI allows it (MPI_THREAD_MULTIPLE; "
               "else between layers); false = all after backward (docs/performance.md)."),
          s.overlap...);
  v.field("parallel.zero_stage",
          Spec("ZeRO stage (docs/performance.md, \"ZeRO\"): 0 = every data rank holds the "
               "AdamW moments of every parameter; 1 = each holds those of its shard only "
               "(gradients reduce-scattered in buckets during backward, AdamW on the shard, "
               "parameters all-gathered), the same losses and parameters bit for bit; 2 = "
               "also the gradient memory outside the shard returned to the system as each "
               "bucket is reduced. Host-memory runs (mpi, shm); with one data rank it does "
               "nothing (a warning). With parallel.expert > 1 (mpi) each rank's own experts "
               "are sharded over the ranks holding the same experts.")
              .at_least(0)
              .at_most(2),
          s.zero_stage...);
  v.field("parallel.timeout_s",
          Spec("Deadline of every collective in seconds; the hang watchdog's limit.")
              .above(0)
              .at_most(kMaxTimeoutS),
          s.timeout_s...);
  v.field("parallel.init_timeout_s",
          Spec("Deadline of each start-up step (MPI/NCCL set-up) in seconds.")
              .above(0)
              .at_most(kMaxTimeoutS),
          s.init_timeout_s...);
}

template <class V, class... S>
void visit_kernels(V& v, S&... s) {
  v.section("kernels", "Compute kernels.");
  v.field("kernels.backend", Spec("Kernel back end."), s.backend...);
  v.field("kernels.host_gemm",
          Spec("Who runs the matrix products on the host: auto = dstrain's own AVX-512 kernels "
               "where the CPU has AVX-512F for attention and for the dense layers' forward and "
               "input-gradient products (those only while the host BLAS runs one thread), "
               "OpenBLAS for the rest (weight gradients); blas = OpenBLAS for every product; "
               "dstrain = dstrain's kernels for every product (an error on a CPU without "
               "AVX-512F). dstrain's kernels give the same bits on every CPU that runs them "
               "(docs/performance.md)."),
          s.host_gemm...);
}

template <class V, class... S>
void visit_checkpoint(V& v, S&... s) {
  v.section("checkpoint", "Checkpoints and resuming.");
  v.field("checkpoint.every_steps",
          Spec("Checkpoint interval in steps; 0 = only at the end.").at_least(0), s.every_steps...);
  v.field("checkpoint.keep_last", Spec("Checkpoints kept on disk.").at_least(1), s.keep_last...);
  v.field("checkpoint.resume",
          Spec("auto = the newest checkpoint in output_dir if any; none = start fresh; "
               "otherwise a checkpoint path.")
              .with_note("auto | none | a path"),
          s.resume...);
}

template <class V, class... S>
void visit_logging(V& v, S&... s) {
  v.section("logging", "Console and metrics logging.");
  v.field("logging.every_steps", Spec("Log a line every this many steps.").at_least(1),
          s.every_steps...);
  v.field("logging.metrics_file", Spec("JSON Lines metrics file, relative to run.output_dir."),
          s.metrics_file...);
  v.field("logging.peak_gflops",
          Spec("Per-rank peak in GFLOP/s the MFU is reported against (a node's rated peak "
               "divided by its ranks); 0 = measured at start-up on CPUs (three 2048^3 "
               "products on rank 0, about a second), the rated peak of a known GPU.")
              .at_least(0),
          s.peak_gflops...);
}

template <class V, class... S>
void visit_eval(V& v, S&... s) {
  v.section("eval", "Periodic evaluation on data.valid.");
  v.field("eval.every_steps", Spec("Evaluation interval in steps; 0 = never.").at_least(0),
          s.every_steps...);
  v.field("eval.batches", Spec("Validation batches per evaluation.").at_least(1), s.batches...);
}

template <class V, class... S>
void visit_debug(V& v, S&... s) {
  v.section("debug", "Determinism, consistency checks and fault injection for tests.");
  v.field("debug.deterministic",
          Spec("Use deterministic kernels and reductions only (bitwise reproducible runs). "
               "false allows the fused cuDNN attention of GPU runs in bf16/fp16, whose "
               "backward accumulates with atomics."),
          s.deterministic...);
  v.field("debug.consistency_every",
          Spec("Cross-rank parameter hash check interval in steps; 0 = never.").at_least(0),
          s.consistency_every...);
  v.field("debug.nan_policy", Spec("On a non-finite loss: abort the job, or skip the step."),
          s.nan_policy...);
  v.field("debug.inject_nan_step",
          Spec("Put a NaN into the last rank's gradient at this step (0-based); -1 = off.")
              .at_least(-1),
          s.inject_nan_step...);
  v.field("debug.inject_overflow_step",
          Spec("Put +inf into the last rank's gradient at this step (0-based), as an fp16 "
               "overflow would: with training.precision fp16 every rank skips the step and "
               "halves the loss scale; -1 = off.")
              .at_least(-1),
          s.inject_overflow_step...);
  v.field("debug.inject_hang_rank",
          Spec("This rank stops calling collectives; -1 = off.").at_least(-1).at_most(kIntMax),
          s.inject_hang_rank...);
  v.field("debug.inject_hang_alltoallv_rank",
          Spec("Once this run has committed a checkpoint, this rank hangs in the next step's "
               "first expert all-to-all-v (parallel.expert > 1), so its peers wait in it; "
               "-1 = off.")
              .at_least(-1)
              .at_most(kIntMax),
          s.inject_hang_alltoallv_rank...);
  v.field("debug.inject_exit_rank",
          Spec("This rank exits mid-run; -1 = off.").at_least(-1).at_most(kIntMax),
          s.inject_exit_rank...);
  v.field("debug.inject_exit_in_checkpoint",
          Spec("Exit while a checkpoint is half written (tests atomic checkpoints)."),
          s.inject_exit_in_checkpoint...);
  v.field("debug.inject_read_delay_ms", Spec("Delay added to every data read, in ms.").at_least(0),
          s.inject_read_delay_ms...);
  v.field("debug.inject_divergence_rank",
          Spec("Perturb one parameter on this rank after the first step, so the consistency "
               "check must catch it; -1 = off.")
              .at_least(-1)
              .at_most(kIntMax),
          s.inject_divergence_rank...);
  v.field("debug.inject_straggler_rank",
          Spec("This rank sleeps debug.inject_straggler_ms in every step's data phase, as a "
               "slow reader or a slow node would, so the phases record must name it the "
               "slowest; -1 = off.")
              .at_least(-1)
              .at_most(kIntMax),
          s.inject_straggler_rank...);
  v.field("debug.inject_straggler_ms",
          Spec("The straggler's delay per step, in ms (debug.inject_straggler_rank).")
              .at_least(0)
              .at_most(600000),
          s.inject_straggler_ms...);
  v.field("debug.expert_nodes",
          Spec("Node-limited routing (model.moe.max_nodes_per_token) for tests: pretend the "
               "routed experts lie on this many nodes, node j holding experts [j E/n, (j+1) "
               "E/n), whatever the hosts and parallel.expert; 0 = the expert group's real "
               "hosts.")
              .at_least(0)
              .at_most(kIntMax),
          s.expert_nodes...);
}

/// The whole deck, in document order.
template <class V, class... C>
void visit_schema(V& v, C&... c) {
  visit_run(v, c.run...);
  visit_model(v, c.model...);
  visit_data(v, c.data...);
  visit_training(v, c.training...);
  visit_parallel(v, c.parallel...);
  visit_kernels(v, c.kernels...);
  visit_checkpoint(v, c.checkpoint...);
  visit_logging(v, c.logging...);
  visit_eval(v, c.eval...);
  visit_debug(v, c.debug...);
}

}  // namespace dst::config::detail
