#include "train/checkpoint_state.hpp"

#include <algorithm>
#include <cstdint>

#include "core/error.hpp"

namespace dst::train {

namespace {

std::vector<std::int64_t> dims_of(const tensor::Shape& s) {
  return std::vector<std::int64_t>(s.dims.begin(), s.dims.begin() + s.rank);
}

const char* const kPrefixes[3] = {"params/", "optimizer/exp_avg/", "optimizer/exp_avg_sq/"};

}  // namespace

CheckpointState::CheckpointState(const config::RunConfig& config, const config::Layout& layout,
                                 comm::ProcessGroups& groups, const model::ParamStore& store,
                                 GradSync& sync, const WholeModel& whole, bool own_experts)
    : groups_(groups),
      store_(store),
      sync_(sync),
      whole_(whole),
      stages_(layout.pipeline),
      stage_(groups.pipeline_rank),
      tensor_(layout.tensor),
      own_experts_(own_experts),
      experts_per_rank_(
          own_experts ? static_cast<int>(config.model.n_routed_experts / layout.expert) : 0) {}

std::vector<ckpt::TensorRef> CheckpointState::own_tensors(const GradSync::State& state) const {
  std::vector<ckpt::TensorRef> out;
  out.reserve(3 * store_.size());
  const float* const bases[3] = {state.params, state.m, state.v};
  for (std::size_t part = 0; part < 3; ++part)
    for (std::size_t i = 0; bases[part] != nullptr && i < store_.size(); ++i) {
      const model::ParamSpec& spec = store_.spec(i);
      out.push_back({kPrefixes[part] + spec.name, dims_of(spec.shape), bases[part] + spec.offset});
    }
  return out;
}

std::vector<ckpt::TensorRef> CheckpointState::whole_tensors(bool params_only,
                                                            std::vector<int>& owner) const {
  std::vector<ckpt::TensorRef> out;
  owner.clear();
  for (std::size_t part = 0; part < (params_only ? 1u : 3u); ++part)
    for (int s = 0; s < stages_; ++s)
      for (const model::ParamSpec& spec : whole_.stage_specs()[static_cast<std::size_t>(s)]) {
        if (whole_.is_embedding_copy(s, spec.name)) continue;  // stage 0's table
        out.push_back({kPrefixes[part] + spec.name, dims_of(spec.shape), nullptr});
        owner.push_back(s);
      }
  return out;
}

std::unordered_map<std::string, std::size_t> CheckpointState::index_by_name(
    const std::vector<ckpt::TensorRef>& tensors) {
  std::unordered_map<std::string, std::size_t> index;
  for (std::size_t k = 0; k < tensors.size(); ++k)
    index[tensors[k].name] = k;
  return index;
}

int CheckpointState::expert_owner(const std::string& name) const {
  static const std::string kExperts = ".mlp.experts.";
  const std::size_t at = name.find(kExperts);
  if (!own_experts_ || at == std::string::npos) return -1;
  const std::int64_t id = std::stoll(name.substr(at + kExperts.size()));
  return static_cast<int>(id / experts_per_rank_);
}

CheckpointStream CheckpointState::stream(const bool params_only) const {
  // This rank's own tensors (sharded moments gathered whole, a device's copied down).
  auto own =
      std::make_shared<const std::vector<ckpt::TensorRef>>(own_tensors(sync_.saved(params_only)));
  const auto is_param = [](const std::string& name) { return name.rfind("params/", 0) == 0; };
  CheckpointStream out;
  if (!whole_.layout()) {
    for (const ckpt::TensorRef& t : *own)
      if (!params_only || is_param(t.name)) out.tensors.push_back({t.name, t.shape, nullptr});
    out.source = [own](std::size_t i) { return (*own)[i].data; };
    return out;
  }
  std::vector<int> owner;
  out.tensors = whole_tensors(params_only, owner);
  auto index =
      std::make_shared<const std::unordered_map<std::string, std::size_t>>(index_by_name(*own));
  auto whole = std::make_shared<std::vector<float>>();
  auto slices = std::make_shared<std::vector<float>>();
  const std::vector<ckpt::TensorRef> names = out.tensors;
  out.source = [this, own, index, owner, names, whole, slices](std::size_t i) -> const float* {
    const auto n = static_cast<std::size_t>(ckpt::element_count(names[i].shape));
    whole->resize(n);
    const int s = owner[i];
    // Own experts: a routed expert's tensor comes from the rank that holds it.
    const int expert = expert_owner(names[i].name);
    if (s == stage_ && (expert < 0 || expert == groups_.expert_rank)) {
      // This stage's tensor: this rank's slice, and with slices every slice put in place.
      const std::size_t k = index->at(names[i].name);
      const model::ParamSpec& spec = store_.spec(k % store_.size());
      const auto local = static_cast<std::size_t>(spec.shape.numel());
      const float* mine = (*own)[k].data;
      if (tensor_ == 1 || spec.split == model::Split::replicated) {
        std::copy(mine, mine + local, whole->data());
      } else {
        slices->resize(local * static_cast<std::size_t>(tensor_));
        groups_.tensor->allgather(mine, slices->data(), local, DType::f32);
        // A slice shared by tp_replicas ranks: from the first of them.
        for (int r = 0; r < tensor_; r += spec.tp_replicas) {
          model::ParamSpec slice = spec;
          slice.tp_rank = r / spec.tp_replicas;
          model::copy_slice_to_whole(slice, slices->data() + static_cast<std::size_t>(r) * local,
                                     whole->data());
        }
      }
    }
    if (expert >= 0) groups_.expert->broadcast(whole->data(), n, DType::f32, expert);
    // From the stage that holds it to every stage (its rank in the pipeline group is s).
    if (stages_ > 1) groups_.pipeline->broadcast(whole->data(), n, DType::f32, s);
    return whole->data();
  };
  return out;
}

void CheckpointState::read(ckpt::Reader& reader) const {
  // The buffers to read into (host copies where the state is sharded or on a device,
  // which the reads fill whole: a mismatch throws before any read).
  const auto own = own_tensors(sync_.to_restore());
  // Stages, tensor slices, own experts: every rank reads the whole model tensor by tensor
  // (the reads are collective) and keeps its part.
  std::vector<int> owner;
  const auto wanted = whole_.layout() ? whole_tensors(false, owner) : own;
  // Every difference at once, so a wrong deck is diagnosed in one attempt.
  std::vector<std::string> problems;
  for (const auto& w : wanted) {
    const ckpt::TensorInfo* have = reader.find(w.name);
    if (!have)
      problems.push_back(w.name + ": missing from the checkpoint (model wants " +
                         ckpt::shape_text(w.shape) + ")");
    else if (have->shape != w.shape)
      problems.push_back(w.name + ": checkpoint " + ckpt::shape_text(have->shape) + ", model " +
                         ckpt::shape_text(w.shape));
  }
  const auto wanted_index = index_by_name(wanted);
  for (const auto& have : reader.tensors())
    if (wanted_index.count(have.name) == 0)
      problems.push_back(have.name + ": in the checkpoint but not in this model");
  if (!problems.empty()) {
    std::string msg = "checkpoint '" + reader.path() + "' does not match this model (" +
                      std::to_string(problems.size()) + " tensors):";
    for (const auto& p : problems)
      msg += "\n  " + p;
    throw ckpt::CheckpointError(ckpt::CheckpointError::Kind::mismatch, msg);
  }
  if (!whole_.layout()) {
    for (const auto& w : wanted)
      reader.read(w.name, w.shape, const_cast<float*>(w.data));
    return;
  }
  // One whole tensor at a time; this stage's tensors give this rank's slice of them.
  const auto index = index_by_name(own);
  std::vector<float> buffer;
  std::size_t kept = 0;
  for (std::size_t i = 0; i < wanted.size(); ++i) {
    buffer.resize(static_cast<std::size_t>(ckpt::element_count(wanted[i].shape)));
    reader.read(wanted[i].name, wanted[i].shape, buffer.data());
    const auto found = index.find(wanted[i].name);
    // Another stage's tensor, but for the embedding table of which the last stage holds a
    // copy (it is in this rank's store: every other stage's tensor is not).
    if (owner[i] != stage_ && found == index.end()) continue;
    if (found == index.end() && expert_owner(wanted[i].name) >= 0) continue;  // another's
    const std::size_t k = index.at(wanted[i].name);
    model::copy_slice_from_whole(store_.spec(k % store_.size()), buffer.data(),
                                 const_cast<float*>(own[k].data));
    ++kept;
  }
  if (kept != own.size())
    throw Error("trainer: restoring pipeline stage " + std::to_string(stage_) + ": " +
                std::to_string(own.size() - kept) + " of its tensors are not in the whole model");
}

}  // namespace dst::train
