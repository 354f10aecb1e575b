#pragma once
/// \file stage.hpp
/// The part of the model one pipeline stage holds (parallel.pipeline, docs/performance.md
/// "pipeline parallelism"): blocks [first, last), the embedding on the first stage, the
/// final norm, the head and the loss on the last. A stage builds and allocates only its
/// layers: its ParamStore holds their parameters (the same names as the whole model's),
/// its activation arena one record per micro-batch in flight (`slots`). The blocks may be
/// dense or DeepSeekMoE (latent attention or not): each record of an MoE block has its
/// own host routing. With tied embeddings or the MTP module (which both read the embedding
/// table at the head's end) the last stage also holds a copy of the table, first in its
/// store; the two ends sum their gradients of it before the data group's reduction (the
/// trainer's "embedding group", Megatron-LM's name), so both copies take the same steps.
///
/// Under the interleaved schedule (parallel.virtual_stages V > 1) a rank holds V chunks,
/// each a StageBlocks of one virtual stage (rank_chunks): chunk c of rank p is virtual
/// stage c x P + p, the embedding is on rank 0's chunk 0 and the head on rank P - 1's
/// chunk V - 1.

#include <cstdint>
#include <vector>

#include "config/run_config.hpp"
#include "model/layers/moe_dispatch.hpp"
#include "model/layers/tensor_parallel.hpp"
#include "model/param_store.hpp"

namespace dst::model {

struct StageBlocks {
  std::int64_t first = 0;
  std::int64_t last = -1;  ///< -1: every block (the whole model)
  bool embedding = true;   ///< holds the embedding (the first stage)
  bool head = true;        ///< holds the final norm, the head and the loss (the last stage)
  /// Activation records kept at once: the micro-batches a 1F1B stage has in flight
  /// (model::max_in_flight); 1 for the whole model. The last stage has one in flight, so
  /// the head's record is single.
  std::int64_t slots = 1;

  /// The whole model: every block, the embedding and the head, one record.
  static StageBlocks whole() { return {}; }
  bool is_whole(std::int64_t n_layers) const {
    return first == 0 && (last == -1 || last == n_layers) && embedding && head;
  }
};

/// (Virtual) stage `stage`'s blocks under config.parallel (pipeline_stage_layers), with
/// `slots` records. Throws dst::Error for a stage outside [0, pipeline x virtual stages).
StageBlocks stage_blocks(const config::RunConfig& config, int stage, std::int64_t slots);

/// The parameters stage `s` holds, in state-dict order, with the offsets of their own
/// store (dense_parameter_layout for the whole model); with a tensor-parallel slice `tp`,
/// that rank's slices of them; with an expert slice `ep`, that rank's routed experts only
/// (after the other tensors).
std::vector<ParamSpec> stage_parameter_layout(const config::ModelSection& m, const StageBlocks& s,
                                              const TensorSlice& tp = {},
                                              const ExpertSlice& ep = {});

/// The model chunks per pipeline rank: parallel.virtual_stages with more than one stage,
/// else 1.
int pipeline_chunks(const config::RunConfig& config);

/// Pipeline rank `rank`'s chunks, chunk 0 first, each with the records the schedule keeps
/// in flight over `micro_batches` (chunk_in_flight; one each for micro_batches 0). Throws
/// dst::Error for a rank outside [0, parallel.pipeline) and what chunk_in_flight refuses.
std::vector<StageBlocks> rank_chunks(const config::RunConfig& config, int rank,
                                     std::int64_t micro_batches);

/// The most point-to-point messages pipeline rank `rank` holds copies of at once
/// (train::Trainer copies what it sends and frees the copy once the send has completed),
/// given every rank's chunks (rank_chunks of each, rank 0 first). A chunk's send of
/// micro-batch j's activations completes before its backward of j starts (the gradient
/// comes back only after the next virtual stage received j): at most its records in
/// flight. Its send of j's gradient completes once the previous virtual stage has started
/// its backward of j, which keeps j in flight until then: at most that chunk's records.
std::int64_t sends_in_flight(const std::vector<std::vector<StageBlocks>>& ranks_chunks, int rank);

/// Whether the last pipeline stage holds a copy of the embedding table: more than one
/// stage, and tied embeddings or the MTP module (Transformer::holds_embedding_copy).
bool stages_share_embedding(const config::RunConfig& config);

/// The DeepSeekMoE blocks among `blocks`' (their layers [first, last)).
std::int64_t moe_blocks_in(const config::ModelSection& m, const StageBlocks& blocks);

/// Whether expert parallelism stores each rank's own routed experts only on pipeline stage
/// `stage`: a model with routed experts, without pipeline stages or with an MoE block on
/// that stage, the MTP module's included (a stage without one has no experts: nothing to
/// split).
bool own_expert_storage(const config::RunConfig& config, int stage = 0);

/// The parameters of a rank's chunks (Transformer::parameter_layout of them).
std::vector<ParamSpec> stage_parameter_layout(const config::ModelSection& m,
                                              const std::vector<StageBlocks>& chunks,
                                              const TensorSlice& tp = {},
                                              const ExpertSlice& ep = {});

}  // namespace dst::model
