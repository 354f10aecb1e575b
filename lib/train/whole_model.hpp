#pragma once
/// \file whole_model.hpp
/// Where this rank's tensors stand in the whole model. With pipeline stages, tensor
/// slices or per-rank experts a rank's store holds part of the model; a checkpoint, the
/// gradient norm, the consistency check and the naming of non-finite gradients speak of
/// the whole model's tensors (names, whole shapes, the order of a one-stage run), which
/// this layout gives them: the whole model's tensors and each stage's.

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "comm/process_groups.hpp"
#include "config/run_config.hpp"
#include "model/param_store.hpp"
#include "train/global_norm.hpp"

namespace dst::train {

class WholeModel {
 public:
  /// `own_experts`: expert parallelism's storage is this rank's (its store ends in its own
  /// routed experts).
  WholeModel(const config::RunConfig& config, const config::Layout& layout, int stage,
             bool own_experts);

  /// The whole model's layout (planned, not allocated) where this rank's store is not the
  /// whole model (stages, slices or own experts), else null.
  const model::ParamStore* layout() const { return whole_.get(); }
  /// Each stage's parameter specs (whole tensors; offsets of the stage's own store), where
  /// layout() is not null.
  const std::vector<std::vector<model::ParamSpec>>& stage_specs() const { return stage_specs_; }
  /// Whether stage s's tensor `name` is the last stage's copy of the embedding table (tied
  /// embeddings or the MTP module with stages), which the whole model holds once.
  bool is_embedding_copy(int s, const std::string& name) const;
  /// The GlobalNorm parts of this rank's `store` (its tensor slices, own experts from
  /// tensor `own_experts_from`, stage), over `groups`.
  GlobalNorm::Parts norm_parts(comm::ProcessGroups& groups, const model::ParamStore& store,
                               std::size_t own_experts_from) const;

 private:
  const config::RunConfig& cfg_;
  int stages_ = 1, stage_ = 0, tensor_ = 1;
  bool own_experts_ = false;
  std::unique_ptr<model::ParamStore> whole_;
  std::vector<std::vector<model::ParamSpec>> stage_specs_;
};

}  // namespace dst::train
