#pragma once
/// \file transformer.hpp
/// The dense decoder's layers in order: an embedding, n_layers blocks and a head
///   embedding -> blocks [0, L) -> head (final norm, lm head, loss)
/// (with model.mtp_depth 1 a multi-token prediction module after the head, which training
/// runs and generation skips), with the parameter layout they declare, and the forward and backward
/// of a range of blocks [first, last): what a pipeline stage runs. LanguageModel (training) and
/// Decoder (KV-cache inference) compute through the same layers; each owns its buffers.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "config/run_config.hpp"
#include "model/layers/attention.hpp"
#include "model/layers/block.hpp"
#include "model/layers/embedding.hpp"
#include "model/layers/head.hpp"
#include "model/layers/layer.hpp"
#include "model/layers/moe_dispatch.hpp"
#include "model/layers/multi_token_prediction.hpp"
#include "model/layers/tensor_parallel.hpp"
#include "model/param_store.hpp"
#include "model/stage.hpp"

namespace dst::model {

class Transformer {
 public:
  /// `tp`: this rank's tensor-parallel slice of the layers (tensor_parallel.hpp); the
  /// layout then holds the slices' shapes. Throws dst::Error for a model kind tensor
  /// parallelism is not built for.
  /// `ep`: this rank's expert slice (expert parallelism's storage, layers/moe_dispatch.hpp):
  /// the MoE blocks (the MTP module's too) hold their slice of the routed experts only, and
  /// the layout puts those tensors (ParamSpec::ep_size > 1) after all the others, in the
  /// same relative order.
  explicit Transformer(const config::ModelSection& m, const TensorSlice& tp = {},
                       const ExpertSlice& ep = {});

  /// Every layer's parameters in state-dict order (offsets are assigned by ParamStore).
  std::vector<ParamSpec> parameter_layout() const;
  /// The parameters of a pipeline stage's layers only (model/stage.hpp), in the same order.
  std::vector<ParamSpec> parameter_layout(const StageBlocks& stage) const;
  /// Those of a pipeline rank's chunks (the interleaved schedule: several, ascending and
  /// apart; the embedding only with the first, the head only with the last): the
  /// embedding, each chunk's blocks in turn, the head. Throws dst::Error for chunks out of
  /// order.
  std::vector<ParamSpec> parameter_layout(const std::vector<StageBlocks>& chunks) const;
  /// Resolves every layer's parameters in `params` by name.
  void bind(const ParamStore& params);
  /// Resolves those of a stage's layers only (the others are not in its store).
  void bind(const ParamStore& params, const StageBlocks& stage);
  void bind(const ParamStore& params, const std::vector<StageBlocks>& chunks);

  /// This rank's tensor-parallel slice of the layers ({0, 1}: the whole layers).
  const TensorSlice& tensor_slice() const { return tp_; }
  /// This rank's expert slice ({0, 1}: every routed expert).
  const ExpertSlice& expert_slice() const { return ep_; }
  const Embedding& embedding() const { return embedding_; }
  const Block& block(std::int64_t l) const { return blocks_[static_cast<std::size_t>(l)]; }
  std::int64_t n_blocks() const { return static_cast<std::int64_t>(blocks_.size()); }
  const Head& head() const { return head_; }
  /// The multi-token prediction module (model.mtp_depth 1); nullptr without one.
  const MultiTokenPrediction* mtp() const { return mtp_ ? &*mtp_ : nullptr; }
  /// Whether a rank holding `chunks` keeps a copy of the embedding table: the last
  /// pipeline stage without the embedding, when its head reads the table (tied
  /// embeddings) or its MTP module embeds tokens. The copy is declared first (offset 0,
  /// as on the first stage), under the table's name; the trainer sums the two stages'
  /// gradients of it (model/stage.hpp).
  bool holds_embedding_copy(const std::vector<StageBlocks>& chunks) const;

  /// Blocks [first, last) forward over B sequences of T tokens: block l reads acts[l].x
  /// and writes the next block's input acts[l + 1].x, the last one `out` (N, C).
  void forward_blocks(const Compute& c, const Rope& rope, std::int64_t B, std::int64_t T,
                      const std::vector<BlockActs>& acts, std::int64_t first, std::int64_t last,
                      const tensor::Tensor& out) const;
  /// Blocks [first, last) backward, from last - 1 down to first: d_x holds d(loss)/d(the
  /// range's output) on entry, d(loss)/d(acts[first].x) on return. ready(): see
  /// Block::backward.
  void backward_blocks(const Compute& c, const Rope& rope, std::int64_t B, std::int64_t T,
                       const std::vector<BlockActs>& acts, const BlockScratch& s,
                       std::int64_t first, std::int64_t last, const tensor::Tensor& d_x,
                       const OnReady& ready) const;

 private:
  void check_chunks(const std::vector<StageBlocks>& chunks) const;
  TensorSlice tp_;
  ExpertSlice ep_;
  Embedding embedding_;
  std::vector<Block> blocks_;
  Head head_;
  std::optional<MultiTokenPrediction> mtp_;  // declared after the head
  bool tied_ = false;                        // model.tie_embeddings
};

}  // namespace dst::model
