#include "model/transformer.hpp"

#include <algorithm>
#include <string>

#include "core/error.hpp"

namespace dst::model {

Transformer::Transformer(const config::ModelSection& m, const TensorSlice& tp,
                         const ExpertSlice& ep)
    : tp_(tp), ep_(ep), embedding_(m.vocab_size, m.d_model, tp.size), head_(m, tp.size) {
  if (tp.size > 1 && (m.mla() || m.n_routed_experts > 0 || m.mtp_depth > 0))
    throw Error(
        "model: tensor parallelism is built for the dense decoder only (no latent attention, "
        "DeepSeekMoE or multi-token prediction)");
  blocks_.reserve(static_cast<std::size_t>(m.n_layers));
  for (std::int64_t l = 0; l < m.n_layers; ++l)
    blocks_.emplace_back(m, l, tp.size, ep, tp.row_split() > 1);
  if (m.mtp_depth > 0) mtp_.emplace(m);
}

std::vector<ParamSpec> Transformer::parameter_layout() const {
  return parameter_layout(StageBlocks::whole());
}

namespace {
std::int64_t last_of(const StageBlocks& s, std::int64_t n) {
  const std::int64_t last = s.last < 0 ? n : s.last;
  if (s.first < 0 || s.first >= last || last > n)
    throw Error("model: stage blocks [" + std::to_string(s.first) + ", " + std::to_string(last) +
                ") are not a non-empty range within the " + std::to_string(n) + " blocks");
  return last;
}
}  // namespace

std::vector<ParamSpec> Transformer::parameter_layout(const StageBlocks& stage) const {
  const std::int64_t last = last_of(stage, n_blocks());
  std::vector<ParamSpec> specs;
  if (stage.embedding) embedding_.declare(specs);
  for (std::int64_t l = stage.first; l < last; ++l)
    blocks_[static_cast<std::size_t>(l)].declare(specs);
  if (stage.head) {
    head_.declare(specs);
    if (mtp_) mtp_->declare(specs);
  }
  mark_tensor_slices(specs, tp_.rank, tp_.size);
  // Expert parallelism's storage: this rank's experts after everything replicated over
  // the data group (two regions of the flat buffers, summed over two groups).
  if (ep_.size > 1)
    std::stable_partition(specs.begin(), specs.end(),
                          [](const ParamSpec& s) { return s.ep_size == 1; });
  return specs;
}

void Transformer::bind(const ParamStore& params) {
  bind(params, StageBlocks::whole());
}

void Transformer::bind(const ParamStore& params, const StageBlocks& stage) {
  const std::int64_t last = last_of(stage, n_blocks());
  if (stage.embedding) embedding_.bind(params);
  for (std::int64_t l = stage.first; l < last; ++l)
    blocks_[static_cast<std::size_t>(l)].bind(params);
  if (stage.head) {
    head_.bind(params);
    if (mtp_) mtp_->bind(params);
  }
}

StageBlocks stage_blocks(const config::RunConfig& config, int stage, std::int64_t slots) {
  const std::vector<std::int64_t> layers = config::pipeline_stage_layers(config);
  const auto P = static_cast<int>(layers.size());
  if (stage < 0 || stage >= P || slots < 1)
    throw Error("model: no pipeline stage " + std::to_string(stage) + " of " + std::to_string(P) +
                " with " + std::to_string(slots) + " activation records");
  StageBlocks s;
  for (int i = 0; i < stage; ++i)
    s.first += layers[static_cast<std::size_t>(i)];
  s.last = s.first + layers[static_cast<std::size_t>(stage)];
  s.embedding = stage == 0;
  s.head = stage == P - 1;
  s.slots = slots;
  return s;
}

std::vector<ParamSpec> stage_parameter_layout(const config::ModelSection& m, const StageBlocks& s,
                                              const TensorSlice& tp, const ExpertSlice& ep) {
  return Transformer(m, tp, ep).parameter_layout(s);
}

namespace {
void check_range(std::int64_t first, std::int64_t last, std::int64_t n, std::size_t acts) {
  if (first < 0 || first > last || last > n || static_cast<std::size_t>(last) > acts)
    throw Error("model: block range [" + std::to_string(first) + ", " + std::to_string(last) +
                ") is not within the " + std::to_string(n) + " blocks (" + std::to_string(acts) +
                " activation records)");
}
}  // namespace

void Transformer::forward_blocks(const Compute& c, const Rope& rope, std::int64_t B, std::int64_t T,
                                 const std::vector<BlockActs>& acts, std::int64_t first,
                                 std::int64_t last, const tensor::Tensor& out) const {
  check_range(first, last, n_blocks(), acts.size());
  for (std::int64_t l = first; l < last; ++l) {
    const auto i = static_cast<std::size_t>(l);
    blocks_[i].forward(c, rope, B, T, acts[i], l + 1 < last ? acts[i + 1].x : out);
  }
}

void Transformer::backward_blocks(const Compute& c, const Rope& rope, std::int64_t B,
                                  std::int64_t T, const std::vector<BlockActs>& acts,
                                  const BlockScratch& s, std::int64_t first, std::int64_t last,
                                  const tensor::Tensor& d_x, const OnReady& ready) const {
  check_range(first, last, n_blocks(), acts.size());
  for (std::int64_t l = last - 1; l >= first; --l) {
    const auto i = static_cast<std::size_t>(l);
    blocks_[i].backward(c, rope, B, T, acts[i], s, d_x, ready);
  }
}

std::vector<ParamSpec> dense_parameter_layout(const config::ModelSection& m) {
  return Transformer(m).parameter_layout();
}

}  // namespace dst::model
