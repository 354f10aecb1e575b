#include "train/whole_model.hpp"

#include <unordered_map>

#include "model/layers/embedding.hpp"
#include "model/stage.hpp"
#include "tensor/arena.hpp"

namespace dst::train {

WholeModel::WholeModel(const config::RunConfig& config, const config::Layout& layout, int stage,
                       bool own_experts)
    : cfg_(config),
      stages_(layout.pipeline),
      stage_(stage),
      tensor_(layout.tensor),
      own_experts_(own_experts) {
  if (stages_ == 1 && tensor_ == 1 && !own_experts_) return;
  whole_ = std::make_unique<model::ParamStore>(model::dense_parameter_layout(config.model),
                                               tensor::Arena::Mode::plan);
  const std::vector<model::StageBlocks> one{model::StageBlocks::whole()};
  for (int s = 0; s < stages_; ++s)
    stage_specs_.push_back(
        model::ParamStore(model::stage_parameter_layout(
                              config.model, stages_ > 1 ? model::rank_chunks(config, s, 0) : one),
                          tensor::Arena::Mode::plan)
            .specs());
}

bool WholeModel::is_embedding_copy(int s, const std::string& name) const {
  return s > 0 && s == stages_ - 1 && model::stages_share_embedding(cfg_) &&
         name == model::kEmbeddingTableName;
}

GlobalNorm::Parts WholeModel::norm_parts(comm::ProcessGroups& groups,
                                         const model::ParamStore& store,
                                         std::size_t own_experts_from) const {
  GlobalNorm::Parts parts;
  if (tensor_ > 1) {
    parts.tensor = groups.tensor.get();
    parts.tensor_rank = groups.tensor_rank;
  }
  if (own_experts_) {
    parts.expert = groups.expert.get();
    parts.own_experts_from = own_experts_from;
  }
  if (stages_ == 1) return parts;
  parts.pipeline = groups.pipeline.get();
  for (const auto& specs : stage_specs_)
    parts.stage_sizes.push_back(specs.size());
  // Where each stage's tensors stand in the whole model (the interleaved schedule's
  // chunks leave them out of the model's order; the last stage's copy of the embedding
  // table is counted once, from stage 0).
  for (int s = 0; s < stages_; ++s)
    for (const model::ParamSpec& spec : stage_specs_[static_cast<std::size_t>(s)])
      parts.model_index.push_back(is_embedding_copy(s, spec.name) ? GlobalNorm::kNone
                                                                  : whole_->index_of(spec.name));
  if (own_experts_) {
    // Each own tensor's index in its stage's whole layout.
    std::unordered_map<std::string, std::size_t> at;
    const auto& specs = stage_specs_[static_cast<std::size_t>(stage_)];
    for (std::size_t i = 0; i < specs.size(); ++i)
      at[specs[i].name] = i;
    for (const model::ParamSpec& spec : store.specs())
      parts.stage_index.push_back(at.at(spec.name));
  }
  return parts;
}

}  // namespace dst::train
