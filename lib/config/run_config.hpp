#pragma once
/// \file run_config.hpp
/// The typed, validated run deck. Every key of docs/deck.md is a field here; the
/// schema (schema.hpp) binds each field to its dotted key path, type, default, range
/// and documentation, and drives parsing, validation, YAML echo and the docs.

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/enum_names.hpp"

namespace dst::config {

// ---------------------------------------------------------------------------------------
// Enumerated settings. Each has one name table (EnumNames, core/enum_names.hpp): the deck
// parses through it, to_yaml and the docs print it, and logs use dst::to_string(value).
// The enumerators are in the order of the names.
// ---------------------------------------------------------------------------------------

/// data.format: how data.train/valid are stored.
enum class DataFormat : std::uint8_t {
  automatic,  ///< "auto": text for paths ending in .txt, else HDF5 shards or a manifest
  hdf5,
  text,
};

/// training.optimizer.type.
enum class OptimizerType : std::uint8_t { adamw };

/// training.schedule.type: the learning rate's shape after warm-up.
enum class ScheduleType : std::uint8_t { constant, cosine, linear, inverse_sqrt, multistep };

/// training.schedule.world_size_scaling: how the peak rate follows the world size.
enum class WorldSizeScaling : std::uint8_t { none, linear, sqrt };

/// training.precision: the storage and multiply precision of the forward and backward.
enum class Precision : std::uint8_t { fp32, bf16, fp16 };

/// training.recompute: which activations the backward recomputes instead of keeping them
/// from the forward (docs/performance.md). The gradients are the same bit for bit.
enum class Recompute : std::uint8_t {
  none,       ///< keep every activation the backward reads
  selective,  ///< recompute attention's (B, H, T, T) probabilities (Korthikanti et al. 2022)
  full,       ///< keep each block's input only; recompute the block's forward in backward
};

/// parallel.backend as the deck gives it (runtime::resolve_backends resolves `auto`).
enum class ParallelBackend : std::uint8_t { automatic, mpi, shm, nccl };

/// kernels.backend as the deck gives it (runtime::resolve_backends resolves `auto`).
enum class KernelsBackend : std::uint8_t { automatic, kokkos, cuda };

/// kernels.host_gemm: who runs the host's matrix products (tensor::HostGemm once resolved).
enum class HostGemmSetting : std::uint8_t { automatic, blas, dstrain };

/// parallel.pipeline_schedule: the order of a pipeline stage's forwards and backwards.
enum class PipelineSchedule : std::uint8_t { one_f_one_b, interleaved };

/// debug.nan_policy: what a non-finite loss or gradient does.
enum class NanPolicy : std::uint8_t { abort, skip };

/// checkpoint.resume: `auto` (the newest checkpoint in run.output_dir, if any), `none`
/// (start fresh) or a checkpoint path.
struct ResumeSetting {
  enum class Kind : std::uint8_t { automatic, none, path };
  Kind kind = Kind::automatic;
  std::string path;  ///< Kind::path: the checkpoint; empty otherwise

  /// "auto", "none", or any other text as a path (an empty one included: validation
  /// refuses it, naming the key).
  static ResumeSetting parse(std::string_view text);
  /// The deck's text: "auto", "none" or the path.
  std::string text() const;
};
bool operator==(const ResumeSetting& a, const ResumeSetting& b);
inline bool operator!=(const ResumeSetting& a, const ResumeSetting& b) {
  return !(a == b);
}

struct RunSection {
  std::string name = "dstrain-run";
  std::uint64_t seed = 1234;  ///< the one seed everything derives from
  std::string output_dir = "runs/dstrain-run";
};

/// model.moe.score: how the DeepSeekMoE router turns its logits into expert scores.
enum class MoeScore : std::uint8_t {
  sigmoid,  ///< DeepSeek-V3: independent sigmoids (choice by score + correction bias)
  softmax,  ///< DeepSeek-V2: a softmax over the routed experts
};

/// The DeepSeekMoE training settings that have no field in Hugging Face's config.
struct MoeSection {
  MoeScore score = MoeScore::sigmoid;
  /// gamma of auxiliary-loss-free balancing: after each optimizer step the correction bias
  /// b_i -= gamma * sign(load_i - mean load) (DeepSeek-V3 report, 2.1.2); 0 disables.
  double bias_update_rate = 1.0e-3;
  /// alpha of the sequence-wise balance loss alpha * sum_i f_i P_i; 0 disables.
  double seq_aux_loss_alpha = 1.0e-4;
  /// Expert capacity: each expert takes at most ceil(f N K / E) (token, slot) rows of a
  /// rank's micro-batch of N tokens, the rest dropped (layers/moe_router.hpp,
  /// apply_capacity); 0 = dropless.
  double capacity_factor = 0.0;
  /// Node-limited routing (DeepSeek-V3's M): a token's experts come from at most this many
  /// nodes (layers/moe_router.hpp); 0 = off.
  std::int64_t max_nodes_per_token = 0;
};

/// model.rope_scaling.type: how RoPE's frequencies are stretched past the training context.
enum class RopeScalingType : std::uint8_t {
  none,  ///< RoPE as trained (pre-training at the original context)
  yarn,  ///< YaRN (Peng et al. 2023), as DeepSeek-V2/V3's long-context checkpoints
};

/// YaRN's parameters, named as Hugging Face's rope_scaling (max_position_embeddings of the
/// pre-training run is original_max_seq_len); only read with type yarn.
struct RopeScalingSection {
  RopeScalingType type = RopeScalingType::none;
  double factor = 1.0;                       ///< context extension factor s
  std::int64_t original_max_seq_len = 4096;  ///< the pre-training context
  double beta_fast = 32.0;                   ///< rotations above which a frequency is kept
  double beta_slow = 1.0;                    ///< rotations below which it is interpolated
  double mscale = 1.0;                       ///< numerator of the tables' attention factor
  double mscale_all_dim = 0.0;  ///< denominator, and the softmax scale's mscale^2 (0: off)
};

/// Model shape. Fields start from the preset's values; explicit deck keys override.
struct ModelSection {
  std::string preset = "tiny";  ///< tiny | small | deepseek-1b | deepseek-llm-7b | deepseek-llm-67b
  std::int64_t vocab_size = 260;
  std::int64_t d_model = 256;
  std::int64_t n_layers = 4;
  std::int64_t n_heads = 4;
  std::int64_t n_kv_heads = 4;  ///< < n_heads: grouped-query attention
  std::int64_t ffn_dim = 688;
  std::int64_t max_seq_len = 256;
  double rope_theta = 10000.0;
  double norm_eps = 1.0e-6;
  bool tie_embeddings = false;

  // Multi-head latent attention (DeepSeek-V2/V3), named as Hugging Face's
  // DeepseekV3Config. kv_lora_rank > 0 selects it for every block (n_kv_heads and the head
  // dim d_model / n_heads are then unused).
  std::int64_t q_lora_rank = 0;       ///< 0: q_proj (HF: null); > 0: q_a_proj -> norm -> q_b_proj
  std::int64_t kv_lora_rank = 0;      ///< 0: standard attention
  std::int64_t qk_nope_head_dim = 0;  ///< per-head query/key width without RoPE
  std::int64_t qk_rope_head_dim = 0;  ///< per-head query/key width with RoPE (key shared)
  std::int64_t v_head_dim = 0;        ///< per-head value width
  RopeScalingSection rope_scaling;    ///< YaRN (latent attention only)

  // DeepSeekMoE. n_routed_experts > 0 makes blocks >= first_k_dense_replace MoE blocks.
  std::int64_t n_routed_experts = 0;
  std::int64_t n_shared_experts = 0;     ///< one SwiGLU of n_shared x moe_intermediate_size
  std::int64_t num_experts_per_tok = 0;  ///< top-k routed experts per token
  std::int64_t moe_intermediate_size = 0;
  std::int64_t first_k_dense_replace = 0;  ///< leading blocks that keep the dense MLP
  std::int64_t n_group = 1;                ///< expert groups for group-limited routing
  std::int64_t topk_group = 1;             ///< groups a token may route to
  bool norm_topk_prob = true;              ///< renormalise the chosen experts' weights
  double routed_scaling_factor = 1.0;      ///< multiplies the routed experts' weights
  MoeSection moe;

  // Multi-token prediction (DeepSeek-V3 report, 2.2): mtp_depth 1 adds one module after the
  // main model that predicts the token after next (docs/model.md, "Multi-token prediction").
  std::int64_t mtp_depth = 0;    ///< 0: none; 1: one MTP module (model.layers.<n_layers>.*)
  double mtp_loss_weight = 0.3;  ///< lambda: loss = main + lambda x MTP loss (both means)

  /// Whether the blocks use multi-head latent attention.
  bool mla() const { return kv_lora_rank > 0; }
  /// Whether block `layer` (0-based) uses DeepSeekMoE instead of the dense MLP.
  bool moe_layer(std::int64_t layer) const {
    return n_routed_experts > 0 && layer >= first_k_dense_replace;
  }
  /// Whether the model has an MTP module whose block (layer n_layers, the kind of the
  /// blocks after first_k_dense_replace) is a DeepSeekMoE one.
  bool mtp_moe_block() const { return mtp_depth > 0 && moe_layer(n_layers); }
};

struct DataSection {
  std::string train;  ///< shard glob or manifest; empty = not configured
  std::string valid;
  std::int64_t seq_len = 256;
  DataFormat format = DataFormat::automatic;
  std::string text_separator;  ///< text: a line equal to this separates documents
};

struct OptimizerSection {
  OptimizerType type = OptimizerType::adamw;
  double lr = 3.0e-4;
  std::array<double, 2> betas{0.9, 0.95};
  double eps = 1.0e-8;
  double weight_decay = 0.1;
};

struct ScheduleSection {
  ScheduleType type = ScheduleType::cosine;
  std::int64_t warmup_steps = 20;
  double min_lr_ratio = 0.1;
  /// multistep: at these fractions of max_steps the LR drops to the matching factor.
  std::vector<double> milestones{0.8, 0.9};
  std::vector<double> factors{0.316, 0.1};
  WorldSizeScaling world_size_scaling = WorldSizeScaling::none;
  std::int64_t reference_world_size = 1;
};

struct TrainingSection {
  std::int64_t max_steps = 200;
  std::int64_t stop_at_step = 0;        ///< stop (with a checkpoint) after this step; 0 = never
  std::int64_t global_batch_size = 16;  ///< 0 = derive from grad_accum_steps
  std::int64_t micro_batch_size = 8;
  std::int64_t grad_accum_steps = 0;  ///< only when global_batch_size is 0; 0 = derived
  Precision precision = Precision::fp32;
  Recompute recompute = Recompute::none;
  double grad_clip = 1.0;  ///< 0 = no clipping
  OptimizerSection optimizer;
  ScheduleSection schedule;
};

struct ParallelSection {
  std::int64_t data = 0;  ///< 0 = auto: the world size (every rank is a data rank)
  /// Tensor parallelism (model/layers/tensor_parallel.hpp): each layer split over groups of
  /// `tensor` consecutive ranks (Megatron-LM's layout); divides the heads, kv heads, ffn
  /// dim and vocabulary. Dense decoder on host memory only (the deck refuses the rest).
  std::int64_t tensor = 1;
  /// Sequence parallelism (Korthikanti et al. 2022; model/layers/block.hpp): with tensor > 1,
  /// each rank of a tensor group keeps 1 / tensor of the token rows of the residual stream
  /// and of the blocks' norms, and the tensor group's all-reduces become an all-gather
  /// before and a reduce-scatter after each attention and MLP.
  bool sequence_parallel = false;
  /// Pipeline stages (model/pipeline_schedule.hpp, docs/performance.md "pipeline
  /// parallelism"): the blocks split into this many consecutive stages.
  std::int64_t pipeline = 1;
  /// Blocks per stage, first stage first (the first also holds the embedding, the last the
  /// final norm and the head); empty = an even split (the first stages one more block
  /// when n_layers does not divide).
  std::vector<std::int64_t> pipeline_layers;
  PipelineSchedule pipeline_schedule = PipelineSchedule::one_f_one_b;
  /// The interleaved schedule's model chunks per pipeline rank (V): the blocks split into
  /// pipeline x virtual_stages consecutive virtual stages, virtual stage c x pipeline + p
  /// on rank p. 1 under 1f1b.
  std::int64_t virtual_stages = 1;
  /// Expert parallelism: the routed experts split over groups of `expert` consecutive data
  /// ranks (1 = none). Divides model.n_routed_experts and the data ranks.
  std::int64_t expert = 1;
  ParallelBackend backend = ParallelBackend::automatic;
  double bucket_mb = 25.0;
  /// Start bucket all-reduces during backward, polled by a progress thread (Open MPI
  /// makes no asynchronous progress): about half the exposed communication of the
  /// all-after-backward order on the measured CPU runs (docs/performance.md).
  bool overlap = true;
  /// ZeRO stage of the data group (docs/performance.md, "ZeRO"): 0 = every rank holds the
  /// whole optimizer state; 1 = each rank holds the AdamW moments of its shard of the flat
  /// buffer only, the gradients reduce-scattered and the parameters all-gathered; 2 = also
  /// the gradients outside the shard released as soon as their bucket is reduced.
  std::int64_t zero_stage = 0;
  double timeout_s = 600.0;       ///< deadline of every collective
  double init_timeout_s = 300.0;  ///< deadline of each start-up step
};

struct KernelsSection {
  KernelsBackend backend = KernelsBackend::automatic;
  HostGemmSetting host_gemm = HostGemmSetting::automatic;
};

struct CheckpointSection {
  std::int64_t every_steps = 100;  ///< 0 = only at the end
  std::int64_t keep_last = 3;
  ResumeSetting resume;  ///< auto
};

struct LoggingSection {
  std::int64_t every_steps = 10;
  std::string metrics_file = "metrics.jsonl";
  /// The per-rank peak the MFU is reported against, in GFLOP/s; 0 = measured at start-up
  /// (CPUs: three 2048^3 products on rank 0) or the GPU's rated peak.
  double peak_gflops = 0.0;
};

struct EvalSection {
  std::int64_t every_steps = 100;  ///< 0 = never
  std::int64_t batches = 10;
};

struct DebugSection {
  bool deterministic = true;
  std::int64_t consistency_every = 100;  ///< 0 = never
  NanPolicy nan_policy = NanPolicy::abort;
  std::int64_t inject_nan_step = -1;
  std::int64_t inject_overflow_step = -1;  ///< +inf in the last rank's gradient (fp16 tests)
  std::int64_t inject_hang_rank = -1;
  std::int64_t inject_hang_alltoallv_rank = -1;  ///< hangs in the expert dispatch (EP tests)
  std::int64_t inject_exit_rank = -1;
  bool inject_exit_in_checkpoint = false;
  std::int64_t inject_read_delay_ms = 0;
  std::int64_t inject_divergence_rank = -1;
  std::int64_t inject_straggler_rank = -1;  ///< this rank sleeps inject_straggler_ms a step
  std::int64_t inject_straggler_ms = 0;
  /// Node-limited routing's node map for tests: the routed experts split into this many
  /// equal nodes, whatever the hosts; 0 = the expert group's real hosts.
  std::int64_t expert_nodes = 0;
};

struct RunConfig {
  RunSection run;
  ModelSection model;
  DataSection data;
  TrainingSection training;
  ParallelSection parallel;
  KernelsSection kernels;
  CheckpointSection checkpoint;
  LoggingSection logging;
  EvalSection eval;
  DebugSection debug;
};

/// The layout a config resolves to on a given world size: pipeline x data x tensor ranks.
struct Layout {
  int world_size = 1;
  int data = 1;
  int tensor = 1;
  int pipeline = 1;
  int expert = 1;  ///< parallel.expert: ranks of an expert group (divides data)
  /// Consecutive tensor ranks sharing each key/value head: parallel.tensor / model.n_kv_heads
  /// when that exceeds 1 (the heads are replicated), else 1.
  int kv_replicas = 1;
  std::int64_t grad_accum_steps = 1;   ///< micro-steps per optimizer step
  std::int64_t global_batch_size = 1;  ///< sequences per optimizer step
};

/// Blocks per virtual pipeline stage (parallel.pipeline x parallel.virtual_stages of them;
/// with one chunk per rank, per stage): parallel.pipeline_layers, or the even split of
/// model.n_layers over them (the first n_layers % (pipeline x virtual_stages) one more).
std::vector<std::int64_t> pipeline_stage_layers(const RunConfig& config);

/// Field-by-field equality (doubles compared exactly), generated from the schema so a new
/// key cannot be forgotten; load_deck_text(to_yaml(c)) == c is the round-trip guarantee.
bool operator==(const RunSection& a, const RunSection& b);
inline bool operator!=(const RunSection& a, const RunSection& b) {
  return !(a == b);
}
bool operator==(const ModelSection& a, const ModelSection& b);
inline bool operator!=(const ModelSection& a, const ModelSection& b) {
  return !(a == b);
}
bool operator==(const DataSection& a, const DataSection& b);
inline bool operator!=(const DataSection& a, const DataSection& b) {
  return !(a == b);
}
bool operator==(const OptimizerSection& a, const OptimizerSection& b);
inline bool operator!=(const OptimizerSection& a, const OptimizerSection& b) {
  return !(a == b);
}
bool operator==(const ScheduleSection& a, const ScheduleSection& b);
inline bool operator!=(const ScheduleSection& a, const ScheduleSection& b) {
  return !(a == b);
}
bool operator==(const TrainingSection& a, const TrainingSection& b);
inline bool operator!=(const TrainingSection& a, const TrainingSection& b) {
  return !(a == b);
}
bool operator==(const ParallelSection& a, const ParallelSection& b);
inline bool operator!=(const ParallelSection& a, const ParallelSection& b) {
  return !(a == b);
}
bool operator==(const KernelsSection& a, const KernelsSection& b);
inline bool operator!=(const KernelsSection& a, const KernelsSection& b) {
  return !(a == b);
}
bool operator==(const CheckpointSection& a, const CheckpointSection& b);
inline bool operator!=(const CheckpointSection& a, const CheckpointSection& b) {
  return !(a == b);
}
bool operator==(const LoggingSection& a, const LoggingSection& b);
inline bool operator!=(const LoggingSection& a, const LoggingSection& b) {
  return !(a == b);
}
bool operator==(const EvalSection& a, const EvalSection& b);
inline bool operator!=(const EvalSection& a, const EvalSection& b) {
  return !(a == b);
}
bool operator==(const DebugSection& a, const DebugSection& b);
inline bool operator!=(const DebugSection& a, const DebugSection& b) {
  return !(a == b);
}
bool operator==(const RunConfig& a, const RunConfig& b);
inline bool operator!=(const RunConfig& a, const RunConfig& b) {
  return !(a == b);
}
bool operator==(const Layout& a, const Layout& b);
inline bool operator!=(const Layout& a, const Layout& b) {
  return !(a == b);
}

}  // namespace dst::config

namespace dst {

template <>
struct EnumNames<config::DataFormat> {
  static constexpr std::array<const char*, 3> names{"auto", "hdf5", "text"};
};
template <>
struct EnumNames<config::OptimizerType> {
  static constexpr std::array<const char*, 1> names{"adamw"};
};
template <>
struct EnumNames<config::ScheduleType> {
  static constexpr std::array<const char*, 5> names{"constant", "cosine", "linear", "inverse_sqrt",
                                                    "multistep"};
};
template <>
struct EnumNames<config::WorldSizeScaling> {
  static constexpr std::array<const char*, 3> names{"none", "linear", "sqrt"};
};
template <>
struct EnumNames<config::Precision> {
  static constexpr std::array<const char*, 3> names{"fp32", "bf16", "fp16"};
};
template <>
struct EnumNames<config::Recompute> {
  static constexpr std::array<const char*, 3> names{"none", "selective", "full"};
};
template <>
struct EnumNames<config::ParallelBackend> {
  static constexpr std::array<const char*, 4> names{"auto", "mpi", "shm", "nccl"};
};
template <>
struct EnumNames<config::KernelsBackend> {
  static constexpr std::array<const char*, 3> names{"auto", "kokkos", "cuda"};
};
template <>
struct EnumNames<config::HostGemmSetting> {
  static constexpr std::array<const char*, 3> names{"auto", "blas", "dstrain"};
};
template <>
struct EnumNames<config::RopeScalingType> {
  static constexpr std::array<const char*, 2> names{"none", "yarn"};
};
template <>
struct EnumNames<config::MoeScore> {
  static constexpr std::array<const char*, 2> names{"sigmoid", "softmax"};
};
template <>
struct EnumNames<config::PipelineSchedule> {
  static constexpr std::array<const char*, 2> names{"1f1b", "interleaved"};
};
template <>
struct EnumNames<config::NanPolicy> {
  static constexpr std::array<const char*, 2> names{"abort", "skip"};
};

}  // namespace dst
