#include "model/transformer.hpp"

#include <algorithm>
#include <string>

#include "core/error.hpp"
#include "model/pipeline_schedule.hpp"

namespace dst::model {

Transformer::Transformer(const config::ModelSection& m, const TensorSlice& tp,
                         const ExpertSlice& ep)
    : tp_(tp),
      ep_(ep),
      embedding_(m.vocab_size, m.d_model, tp.size, tp.row_split()),
      head_(m, tp.size, tp.row_split()) {
  blocks_.reserve(static_cast<std::size_t>(m.n_layers));
  for (std::int64_t l = 0; l < m.n_layers; ++l)
    blocks_.emplace_back(m, l, tp.size, ep, tp.row_split() > 1);
  if (m.mtp_depth > 0) mtp_.emplace(m, tp.size, ep, tp.row_split() > 1);
  tied_ = m.tie_embeddings;
}

bool Transformer::holds_embedding_copy(const std::vector<StageBlocks>& chunks) const {
  return !chunks.empty() && !chunks.front().embedding && chunks.back().head &&
         (tied_ || mtp_.has_value());
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
  return parameter_layout(std::vector<StageBlocks>{stage});
}

std::vector<ParamSpec> Transformer::parameter_layout(const std::vector<StageBlocks>& chunks) const {
  check_chunks(chunks);
  std::vector<ParamSpec> specs;
  if (chunks.front().embedding || holds_embedding_copy(chunks)) embedding_.declare(specs);
  for (const StageBlocks& chunk : chunks)
    for (std::int64_t l = chunk.first, last = last_of(chunk, n_blocks()); l < last; ++l)
      blocks_[static_cast<std::size_t>(l)].declare(specs);
  if (chunks.back().head) {
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
  bind(params, std::vector<StageBlocks>{stage});
}

void Transformer::bind(const ParamStore& params, const std::vector<StageBlocks>& chunks) {
  check_chunks(chunks);
  if (chunks.front().embedding || holds_embedding_copy(chunks)) embedding_.bind(params);
  for (const StageBlocks& chunk : chunks)
    for (std::int64_t l = chunk.first, last = last_of(chunk, n_blocks()); l < last; ++l)
      blocks_[static_cast<std::size_t>(l)].bind(params);
  if (chunks.back().head) {
    head_.bind(params);
    if (mtp_) mtp_->bind(params);
  }
}

void Transformer::check_chunks(const std::vector<StageBlocks>& chunks) const {
  if (chunks.empty()) throw Error("model: a pipeline rank holds at least one chunk of blocks");
  std::int64_t end = 0;
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    const StageBlocks& chunk = chunks[c];
    const std::int64_t last = last_of(chunk, n_blocks());
    // Ascending, apart: the flat buffer holds them in the model's order, and a backward's
    // ready(offset) covers everything after its blocks.
    if (c > 0 && chunk.first < end)
      throw Error("model: chunk " + std::to_string(c) + "'s blocks [" +
                  std::to_string(chunk.first) + ", " + std::to_string(last) +
                  ") do not follow the previous chunk's (up to " + std::to_string(end) + ")");
    if ((c > 0 && chunk.embedding) || (c + 1 < chunks.size() && chunk.head))
      throw Error(
          "model: only a rank's first chunk holds the embedding and only its last the "
          "head");
    end = last;
  }
}

StageBlocks stage_blocks(const config::RunConfig& config, int stage, std::int64_t slots) {
  const std::vector<std::int64_t> layers = config::pipeline_stage_layers(config);
  const auto P = static_cast<int>(layers.size());
  if (stage < 0 || stage >= P || slots < 1)
    throw Error("model: no (virtual) pipeline stage " + std::to_string(stage) + " of " +
                std::to_string(P) + " with " + std::to_string(slots) + " activation records");
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

int pipeline_chunks(const config::RunConfig& config) {
  return config.parallel.pipeline > 1 ? static_cast<int>(config.parallel.virtual_stages) : 1;
}

std::vector<StageBlocks> rank_chunks(const config::RunConfig& config, int rank,
                                     std::int64_t micro_batches) {
  const auto P = static_cast<int>(config.parallel.pipeline);
  const int V = pipeline_chunks(config);
  if (rank < 0 || rank >= P)
    throw Error("model: no pipeline rank " + std::to_string(rank) + " of " + std::to_string(P));
  const std::vector<std::int64_t> records =
      micro_batches > 0 ? chunk_in_flight(P, rank, V, micro_batches)
                        : std::vector<std::int64_t>(static_cast<std::size_t>(V), 1);
  std::vector<StageBlocks> out;
  for (int c = 0; c < V; ++c)
    out.push_back(stage_blocks(config, c * P + rank, records[static_cast<std::size_t>(c)]));
  return out;
}

std::int64_t sends_in_flight(const std::vector<std::vector<StageBlocks>>& ranks_chunks, int rank) {
  const auto P = static_cast<int>(ranks_chunks.size());
  if (rank < 0 || rank >= P)
    throw Error("model: no pipeline rank " + std::to_string(rank) + " of " + std::to_string(P));
  const auto V = static_cast<int>(ranks_chunks[static_cast<std::size_t>(rank)].size());
  const auto slots_of = [&](int virtual_stage) {
    return ranks_chunks.at(static_cast<std::size_t>(virtual_stage % P))
        .at(static_cast<std::size_t>(virtual_stage / P))
        .slots;
  };
  std::int64_t n = 0;
  for (int c = 0; c < V; ++c) {
    const int v = c * P + rank;
    if (v + 1 < V * P) n += slots_of(v);  // activations to the next virtual stage
    if (v > 0) n += slots_of(v - 1);      // gradients to the previous one
  }
  return n;
}

std::int64_t moe_blocks_in(const config::ModelSection& m, const StageBlocks& blocks) {
  std::int64_t n = 0;
  for (std::int64_t l = blocks.first, last = blocks.last < 0 ? m.n_layers : blocks.last; l < last;
       ++l)
    n += m.moe_layer(l) ? 1 : 0;
  return n;
}

bool stages_share_embedding(const config::RunConfig& config) {
  return config.parallel.pipeline > 1 &&
         (config.model.tie_embeddings || config.model.mtp_depth > 0);
}

bool own_expert_storage(const config::RunConfig& config, int stage) {
  if (config.model.n_routed_experts == 0) return false;
  if (config.parallel.pipeline == 1) return true;
  std::int64_t moe = 0;
  for (const StageBlocks& chunk : rank_chunks(config, stage, 0))
    moe +=
        moe_blocks_in(config.model, chunk) + (chunk.head && config.model.mtp_moe_block() ? 1 : 0);
  return moe > 0;
}

std::vector<ParamSpec> stage_parameter_layout(const config::ModelSection& m,
                                              const std::vector<StageBlocks>& chunks,
                                              const TensorSlice& tp, const ExpertSlice& ep) {
  return Transformer(m, tp, ep).parameter_layout(chunks);
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
