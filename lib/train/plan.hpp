#pragma once
/// \file plan.hpp
/// What a run needs per rank, without allocating: memory (parameters, master weights,
/// gradients, optimizer state, activations, communication buffers) and the bytes each
/// collective moves per step, and from a row of the rate table the step's predicted time.
/// Memory comes from a layout-only pass of the real model (LanguageModel in planning mode),
/// and the ZeRO shards and the own experts' part from the rules the run's GradSync applies
/// to that store (ZeroShards, locate_own_experts), so that `dstrain check` and a run
/// agree. Parameter and FLOP counts are the model's (model/plan.hpp); the text `check`
/// prints is the app's.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "config/run_config.hpp"
#include "model/param_store.hpp"
#include "model/plan.hpp"

namespace dst::train {

/// Memory one rank needs, in bytes.
struct MemoryPlan {
  std::uint64_t parameters = 0;   ///< the weights the forward reads: fp32, or the 16-bit copy
  std::uint64_t master = 0;       ///< fp32 master weights of a bf16/fp16 run (ZeRO >= 1: a shard)
  std::uint64_t gradients = 0;    ///< fp32 gradient buffer (ZeRO 2: a shard)
  std::uint64_t optimizer = 0;    ///< AdamW first and second moments, fp32 (ZeRO >= 1: a shard)
  std::uint64_t activations = 0;  ///< kept for backward, one micro-batch (layout pass)
  /// training.recompute: the activations the blocks share and the backward refills (full:
  /// one block's record; selective: one layer's attention probabilities). Layout pass.
  std::uint64_t recompute = 0;
  std::uint64_t workspace = 0;  ///< backward scratch and RoPE tables (layout pass)
  std::uint64_t comm = 0;       ///< communication buffers: gradient buckets in flight
  std::uint64_t total() const {
    return parameters + master + gradients + optimizer + activations + recompute + workspace + comm;
  }
};

/// Rates of one kind of host that turn a plan's FLOPs and bytes into seconds
/// (docs/performance.md, "The rate table"): per rank, measured where `source` says so.
struct HostRates {
  std::string kind;                 ///< the name `dstrain check --host` takes
  std::string source;               ///< measured (how, when) or data sheet
  double gemm_fp32_gflops = 0;      ///< matrix products in fp32, per rank
  double gemm_16bit_gflops = 0;     ///< bf16/fp16 products (CPUs emulate them: fp32 speed)
  std::int64_t ranks_per_node = 1;  ///< ranks one node holds
  double intra_node_gbs = 0;        ///< collective bus bandwidth within a node, GB/s
  double inter_node_gbs = 0;        ///< collective bus bandwidth across nodes, GB/s per rank
  double memory_gib = 0;            ///< device memory per rank (0: the host's, not a device)
};

/// The rate table, in order: "cpu" (this project's 2-core VM, shared-memory gradient sum),
/// "cpu-mpi" (the same VM, Open MPI's all-reduce), "h100" and "h200" (SXM, NVLink within
/// 8-GPU nodes, 400 Gb/s InfiniBand per GPU across them: data sheet figures).
const std::vector<HostRates>& rate_table();
/// The row named `kind`; throws dst::Error naming the rows for another name.
const HostRates& host_rates(const std::string& kind);

/// What the plan takes beyond the deck and the layout.
struct PlanOptions {
  /// parallel.zero_stage (ZeRO): 0 every data rank holds everything; 1 the AdamW
  /// moments and the fp32 master weights are divided by the data ranks; 2 the gradients
  /// too (each rank keeps its shard plus the bucket in flight at the end of the backward;
  /// the whole buffer when micro-batches are accumulated).
  int zero_stage = 0;
  /// The row of the rate table that predicts the step time.
  std::string host = "cpu";
  /// The gradient collectives copy buckets through the communicator (MPI, NCCL: two
  /// buckets in flight counted as communication buffers); false for the shared-memory sum
  /// (parallel.backend shm), which adds in the flat buffers themselves.
  bool bucket_copies = true;
  /// The data rank planned for (0: the heaviest). ZeRO over MPI: Open MPI's non-blocking
  /// reduce-scatter reduces each bucket to rank 0 before scattering it (libnbc), so rank 0
  /// holds one bucket more than the others (measured, memory_probe).
  int rank = 0;
};

/// Bytes one rank sends per optimizer step in one collective of the data group (ring
/// algorithms: all-reduce 2 (p-1)/p S, reduce-scatter and all-gather (p-1)/p S).
struct CollectiveVolume {
  std::string what;         ///< "all-reduce of the gradients" ...
  double buffer_bytes = 0;  ///< S, the whole buffer the collective covers
  double bytes_per_rank = 0;
};

/// The predicted time of one optimizer step on a row of the rate table.
struct StepTime {
  double flops_per_rank = 0;  ///< executed (recompute included) on one rank
  double compute_s = 0;       ///< flops_per_rank / the matrix-product rate
  double comm_s = 0;          ///< every collective's bytes per rank / the bus bandwidth
  /// compute_s + comm_s: no overlap assumed, an upper bound (the bucketed gradient
  /// collectives overlap the backward and hide up to min(compute_s, comm_s) of it).
  double total_s() const { return compute_s + comm_s; }
};

struct Plan {
  model::ParamCount params;
  double flops_per_token = 0;  ///< training (forward + backward) model FLOPs per token
  double flops_per_step = 0;   ///< flops_per_token * tokens per optimizer step
  /// What training.recompute adds per token (full: the blocks' forward again; selective:
  /// the attention scores); not model FLOPs (MFU does not count it).
  double recompute_flops_per_token = 0;
  std::int64_t tokens_per_step = 0;
  PlanOptions options;
  MemoryPlan memory;  ///< per rank
  /// The data group's collectives of one step (none on one data rank).
  std::vector<CollectiveVolume> collectives;
  double comm_bytes_per_step = 0;  ///< the collectives' bytes per rank, summed
  StepTime step;                   ///< on host_rates(options.host)
  /// Pipeline stages (parallel.pipeline > 1; empty for one stage): each stage's blocks and
  /// its ranks' memory (its layers only, one activation record per micro-batch 1F1B keeps
  /// in flight). `memory` above is then the heaviest stage's.
  struct Stage {
    std::int64_t first = 0, last = 0;  ///< blocks [first, last) (first and last chunk's)
    /// Each chunk's blocks [first, last): one chunk under 1f1b, virtual_stages under
    /// interleaved.
    std::vector<std::pair<std::int64_t, std::int64_t>> chunks;
    bool embedding = false, head = false;
    /// The last stage's copy of the embedding table (tied embeddings or the MTP module).
    bool embedding_copy = false;
    std::int64_t parameters = 0;
    /// Activation records (micro-batches in flight, summed over the chunks).
    std::int64_t in_flight = 1;
    /// The most point-to-point messages this rank's sends hold copies of at once
    /// (model::sends_in_flight), in memory.comm.
    std::int64_t sends_in_flight = 0;
    MemoryPlan memory;
  };
  std::vector<Stage> stages;
  /// The stage `memory` is (the heaviest; the first of equals), or -1 without stages.
  int heaviest_stage = -1;
  /// Model chunks per pipeline rank (parallel.virtual_stages under interleaved, else 1).
  int chunks = 1;
  /// The schedule's bubble, (P - 1) / (chunks x micro-batches) (0 for one stage).
  double bubble_fraction = 0.0;
  /// Bytes a stage boundary carries per micro-batch in each direction (the activations
  /// forward, their gradient backward: micro-batch x seq_len x d_model fp32).
  double p2p_bytes_per_micro_batch = 0.0;
  /// Stages sharing the embedding table (model::stages_share_embedding): the bytes of its
  /// gradient each end sends the other per step (this rank's table slice, fp32); else 0.
  double embedding_sum_bytes = 0.0;
  /// Expert parallelism (layout.expert > 1): the bytes one rank sends per step in one MoE
  /// layer's all-to-alls (dispatch and combine, forward and backward, every micro-batch;
  /// balanced load assumed); 0 without.
  double alltoall_bytes_per_moe_layer = 0;
  /// Tensor parallelism (layout.tensor > 1): the activation all-reduces over the tensor
  /// group (and over the ranks sharing a key/value head) per step, and the bytes one rank
  /// sends in them (ring); 0 without. Listed in
  /// `collectives` too, but not in comm_bytes_per_step (the data group's).
  double tensor_allreduces_per_step = 0;
  double tensor_bytes_per_step = 0;
  /// Node-limited routing (model.moe.max_nodes_per_token M > 0): the nodes the routed
  /// experts lie on (debug.expert_nodes, or the expert group's ranks over the host kind's
  /// ranks per node), the bound on the nodes one token's rows reach, min(M, top-k, nodes),
  /// and the bytes one rank sends across nodes per step in one MoE layer's all-to-alls:
  /// `cross_node_bytes_per_moe_layer` as dstrain sends them (every (token, expert) row, so
  /// (nodes - 1) / nodes of the rows at balanced load, whatever M), and
  /// `cross_node_dedup_bound_per_moe_layer` the bound M implies for a dispatch that sends
  /// a token once per node (DeepSeek-V3's), at most `token_nodes` copies of each token; 0
  /// without expert parallelism.
  std::int64_t expert_nodes = 1;
  std::int64_t token_nodes = 0;
  double cross_node_bytes_per_moe_layer = 0;
  double cross_node_dedup_bound_per_moe_layer = 0;
  /// model.moe.capacity_factor f > 0: the rows one expert takes of one rank's micro-batch,
  /// ceil(f x micro-batch x seq_len x top-k / n_routed_experts); -1 dropless.
  std::int64_t expert_capacity = -1;
};

/// The most bytes of fp32 optimizer state (one flat buffer's worth: the moments count
/// twice) one data rank holds of `store` under ZeRO: the run's shards (GradSync) over
/// `data_ranks` (whole tensors, or parts of the buffer where the ranks share a node,
/// `by_parts`), plus the own experts' shard over `expert_data_ranks` where the store ends
/// in own experts (ep_size > 1).
std::uint64_t largest_shard_bytes(const model::ParamStore& store, int data_ranks,
                                  int expert_data_ranks, bool by_parts);

/// The whole plan for a config on a layout. Memory comes from a layout-only pass of the
/// real model (LanguageModel in planning mode, with training.recompute), so it is what a run
/// would allocate.
Plan make_plan(const config::RunConfig& c, const config::Layout& layout,
               const PlanOptions& options = {});

}  // namespace dst::train
