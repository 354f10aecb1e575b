#pragma once
/// \file checkpoint_state.hpp
/// The training state a checkpoint holds, as the whole model's tensors whatever the
/// layout: every parameter and both AdamW moments ("params/<name>",
/// "optimizer/exp_avg/<name>", "optimizer/exp_avg_sq/<name>") in the order of a one-stage
/// run. With pipeline stages, tensor slices or per-rank experts each rank holds part of
/// them: a save assembles one whole tensor at a time (the slices all-gathered over the
/// tensor group, an own expert broadcast from its holder over the expert group, then from
/// its stage over the pipeline group) and a restore reads each whole tensor on every rank,
/// which keeps its part. The rank's own state comes from its GradSync (sharded moments
/// gathered whole, a device's copied down).

#include <cstddef>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "ckpt/checkpoint.hpp"
#include "comm/process_groups.hpp"
#include "config/run_config.hpp"
#include "model/param_store.hpp"
#include "train/grad_sync.hpp"
#include "train/whole_model.hpp"

namespace dst::train {

/// A streamed save's tensors (ckpt::Directory::save with a source): `tensors` gives the
/// names and whole shapes (no data), `source(i)` tensor i whole, collectively over every
/// rank (valid until the next call and the next step).
struct CheckpointStream {
  std::vector<ckpt::TensorRef> tensors;
  std::function<const float*(std::size_t)> source;
};

class CheckpointState {
 public:
  /// This rank's state: `store` (its stage's, slices' and own experts' tensors) and the
  /// optimizer state `sync` holds, placed in the whole model by `whole` (all three must
  /// outlive it). `own_experts`: expert parallelism's storage is this rank's
  /// (parallel.expert > 1 on a stage with MoE blocks).
  CheckpointState(const config::RunConfig& config, const config::Layout& layout,
                  comm::ProcessGroups& groups, const model::ParamStore& store, GradSync& sync,
                  const WholeModel& whole, bool own_experts);

  /// The whole model's state for a save (collective over every rank; see the file's
  /// comment). With one stage, no slices and no own experts the source returns views of
  /// this rank's buffers. `params_only`: the parameters alone (final-params.h5).
  CheckpointStream stream(bool params_only) const;
  /// Reads an open checkpoint's tensors into this rank's state (collective): checks that
  /// its tensors are this model's (one CheckpointError(mismatch) listing every missing,
  /// extra or reshaped tensor) and reads them (checksums verified); the caller finishes
  /// with GradSync::restored().
  void read(ckpt::Reader& reader) const;

 private:
  /// This rank's tensors over the flat buffers of `state`: params, then first moments,
  /// then second, in its store's order.
  std::vector<ckpt::TensorRef> own_tensors(const GradSync::State& state) const;
  /// The whole model's tensors' names and shapes (no data) in a one-stage checkpoint's
  /// order, and in `owner` the stage holding each.
  std::vector<ckpt::TensorRef> whole_tensors(bool params_only, std::vector<int>& owner) const;
  /// Own experts: the rank of the expert group that holds the routed-expert tensor `name`
  /// ("...mlp.experts.<id>...."), or -1 for any other tensor (every rank holds it).
  int expert_owner(const std::string& name) const;
  static std::unordered_map<std::string, std::size_t> index_by_name(
      const std::vector<ckpt::TensorRef>& tensors);

  comm::ProcessGroups& groups_;
  const model::ParamStore& store_;
  GradSync& sync_;
  const WholeModel& whole_;
  int stages_ = 1, stage_ = 0, tensor_ = 1;
  bool own_experts_ = false;
  int experts_per_rank_ = 0;  ///< own experts: routed experts per rank of the expert group
};

}  // namespace dst::train
