#include "train/consistency.hpp"

#include <limits>
#include <sstream>
#include <string>

#include "core/error.hpp"
#include "core/exit_codes.hpp"
#include "model/layers/embedding.hpp"
#include "tensor/memory.hpp"

namespace dst::train {

namespace {
constexpr std::int64_t kNone = std::numeric_limits<std::int64_t>::max();
}  // namespace

std::uint64_t fingerprint(const float* p, std::size_t n) {
  std::uint64_t h = 1469598103934665603ull;
  const auto* b = reinterpret_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n * sizeof(float); ++i) {
    h ^= b[i];
    h *= 1099511628211ull;
  }
  return h;
}

ConsistencyChecker::ConsistencyChecker(comm::ProcessGroups& groups, const config::Layout& layout,
                                       Replicas replicas)
    : groups_(groups), layout_(layout), replicas_(replicas) {
  const bool named = layout.pipeline > 1 || layout.tensor > 1 || replicas.own_experts ||
                     replicas.any_stage_own_experts;
  if (named && !replicas.whole)
    throw Error(
        "consistency check: stages, tensor slices or own experts need the whole "
        "model's layout to name the tensors");
}

void ConsistencyChecker::check(const model::ParamStore& ps, const tensor::ExecContext& ctx,
                               std::int64_t step) const {
  const std::size_t P = ps.size();
  std::vector<std::uint64_t> mine(P);
  std::vector<float> host;  // a device's parameters, one tensor at a time
  for (std::size_t i = 0; i < P; ++i) {
    const tensor::Tensor t = ps.param(i);
    const float* p = t.ptr<float>();
    if (tensor::device_of(ctx) != tensor::Device::host) {
      host.resize(static_cast<std::size_t>(t.numel()));
      tensor::download(ctx, t, host.data());
      p = host.data();
    }
    mine[i] = fingerprint(p, static_cast<std::size_t>(t.numel()));
  }
  if (layout_.tensor > 1) check_slices(ps, mine, step);
  check_data_replicas(ps, mine, step);
}

void ConsistencyChecker::check_data_replicas(const model::ParamStore& ps,
                                             const std::vector<std::uint64_t>& prints,
                                             std::int64_t step) const {
  const std::size_t P = ps.size();
  // Stages and tensor slices hold different tensors: the replicas of a stage's slice are
  // its data group.
  const bool split = layout_.pipeline > 1 || layout_.tensor > 1;
  comm::Communicator& group = split ? *groups_.data : *groups_.world;
  // Expert parallelism: the own experts' replicas are the expert-data group (compared
  // after the rest, over the world, holds).
  std::vector<std::uint64_t> mine = prints;
  if (replicas_.own_experts)
    for (std::size_t i = replicas_.own_experts_from; i < P; ++i)
      mine[i] = 0;
  const int n = group.size();
  std::vector<std::uint64_t> all(P * static_cast<std::size_t>(n));
  group.allgather(mine.data(), all.data(), P, DType::u64);
  // The first tensor that differs within this rank's group, and the ranks that differ.
  std::size_t bad = P;
  std::vector<int> differ;
  for (std::size_t i = 0; i < P && bad == P; ++i) {
    for (int r = 1; r < n; ++r)
      if (all[static_cast<std::size_t>(r) * P + i] != all[i]) differ.push_back(r);
    if (!differ.empty()) bad = i;
  }
  std::string name = bad < P ? ps.spec(bad).name : std::string();
  int stage = replicas_.stage, slice = groups_.tensor_rank;
  if (split) {
    // Every rank must stop alike, also the stages whose replicas agree: the lowest tensor
    // of the whole model that differs, and its stage's differing data ranks (one
    // all-reduce each over every rank).
    const model::ParamStore& whole = *replicas_.whole;
    std::int64_t first = bad < P ? static_cast<std::int64_t>(whole.index_of(name)) : kNone;
    groups_.world->allreduce(&first, 1, DType::i64, comm::ReduceOp::min);
    if (first == kNone) {
      if (replicas_.any_stage_own_experts) check_experts(ps, prints, step);  // every stage's
      if (replicas_.shared_embedding) check_embedding_copies(ps, prints, step);
      return;
    }
    name = whole.spec(static_cast<std::size_t>(first)).name;
    // (The lowest tensor slice whose replicas differ there: ranks[1] holds minus its rank.)
    std::vector<std::int64_t> ranks(static_cast<std::size_t>(n) + 2, 0);
    ranks[1] = -std::numeric_limits<std::int64_t>::max();
    const bool holds = bad < P && name == ps.spec(bad).name;
    if (holds) {
      ranks[0] = replicas_.stage;
      ranks[1] = -groups_.tensor_rank;
    }
    groups_.world->allreduce(ranks.data(), 2, DType::i64, comm::ReduceOp::max);
    if (holds && ranks[0] == replicas_.stage && -ranks[1] == groups_.tensor_rank)
      for (const int r : differ)
        ranks[static_cast<std::size_t>(r) + 2] = 1;
    groups_.world->allreduce(ranks.data() + 2, static_cast<std::size_t>(n), DType::i64,
                             comm::ReduceOp::max);
    stage = static_cast<int>(ranks[0]);
    slice = static_cast<int>(-ranks[1]);
    differ.clear();
    for (int r = 1; r < n; ++r)
      if (ranks[static_cast<std::size_t>(r) + 2] != 0) differ.push_back(r);
  } else if (bad == P) {
    if (replicas_.own_experts) check_experts(ps, prints, step);
    return;
  }
  const auto world_rank = [&](int r) {
    if (!split) return r;
    comm::RankCoords c = comm::rank_coords(groups_.world->rank(), layout_);
    c.data = r;
    c.pipeline = stage;
    c.tensor = slice;
    return comm::world_rank_of(c, layout_);
  };
  std::ostringstream os;
  os << "parameters differ between ranks at step " << step << ": first tensor " << name
     << " differs from rank " << world_rank(0) << "'s on rank";
  for (const int r : differ)
    os << " " << world_rank(r);
  throw CollectiveError(os.str(), kExitDiverged);
}

void ConsistencyChecker::check_slices(const model::ParamStore& ps,
                                      const std::vector<std::uint64_t>& mine,
                                      std::int64_t step) const {
  // The tensors every slice holds whole (the norms) must be equal across the tensor group:
  // each slice computes their gradients from the same whole activations; so must a slice
  // shared by several ranks (key/value heads, tp_replicas > 1) across its holders. The
  // lowest tensor of the whole model that differs in any group, and the world ranks whose
  // copy differs from their group's reference there (slice 0, or the shared slice's first
  // holder; two all-reduces over every rank, so that every rank stops alike).
  const model::ParamStore& whole = *replicas_.whole;
  const std::size_t P = ps.size();
  const auto T = static_cast<std::size_t>(layout_.tensor);
  // The tensor rank whose copy of tensor i rank r's must equal (r itself: not shared).
  const auto reference_of = [&](std::size_t i, std::size_t r) {
    if (ps.spec(i).split == model::Split::replicated) return std::size_t{0};
    return r - r % static_cast<std::size_t>(ps.spec(i).tp_replicas);
  };
  std::vector<std::uint64_t> all(P * T);
  groups_.tensor->allgather(mine.data(), all.data(), P, DType::u64);
  std::int64_t first = kNone;
  for (std::size_t i = 0; i < P && first == kNone; ++i) {
    for (std::size_t r = 1; r < T; ++r)
      if (all[r * P + i] != all[reference_of(i, r) * P + i])
        first = static_cast<std::int64_t>(whole.index_of(ps.spec(i).name));
  }
  groups_.world->allreduce(&first, 1, DType::i64, comm::ReduceOp::min);
  if (first == kNone) return;
  const std::string name = whole.spec(static_cast<std::size_t>(first)).name;
  std::vector<std::int64_t> differs(static_cast<std::size_t>(groups_.world->size()), 0);
  std::int64_t reference = kNone;  // the world rank of slice 0 in the lowest such group
  if (groups_.tensor_rank == 0) {
    std::size_t i = P;
    for (std::size_t k = 0; k < P; ++k)
      if (ps.spec(k).name == name) i = k;
    for (std::size_t r = 1; i < P && r < T; ++r)
      if (all[r * P + i] != all[reference_of(i, r) * P + i]) {
        differs[static_cast<std::size_t>(groups_.world->rank()) + r] = 1;
        if (reference == kNone)
          reference = groups_.world->rank() + static_cast<std::int64_t>(reference_of(i, r));
      }
  }
  groups_.world->allreduce(differs.data(), differs.size(), DType::i64, comm::ReduceOp::max);
  groups_.world->allreduce(&reference, 1, DType::i64, comm::ReduceOp::min);
  std::ostringstream os;
  os << "parameters differ between the tensor slices at step " << step << ": tensor " << name
     << (whole.spec(static_cast<std::size_t>(first)).split == model::Split::replicated
             ? " (held whole by every slice)"
             : " (a slice shared by several tensor ranks)")
     << " differs from rank " << reference << "'s on rank";
  for (std::size_t r = 0; r < differs.size(); ++r)
    if (differs[r] != 0) os << " " << r;
  throw CollectiveError(os.str(), kExitDiverged);
}

void ConsistencyChecker::check_embedding_copies(const model::ParamStore& ps,
                                                const std::vector<std::uint64_t>& prints,
                                                std::int64_t step) const {
  const int stages = static_cast<int>(layout_.pipeline);
  const bool holds = replicas_.stage == 0 || replicas_.stage == stages - 1;
  std::uint64_t mine = holds ? prints[ps.index_of(model::kEmbeddingTableName)] : std::uint64_t{0};
  std::vector<std::uint64_t> all(static_cast<std::size_t>(stages));
  groups_.pipeline->allgather(&mine, all.data(), 1, DType::u64);
  // This pipeline group's two ends, when their tables differ: (last end's world rank) x
  // world + (first end's), the highest over the world (every rank stops alike).
  comm::RankCoords c = comm::rank_coords(groups_.world->rank(), layout_);
  const std::int64_t world = groups_.world->size();
  std::int64_t bad = -1;
  if (all.front() != all.back()) {
    c.pipeline = stages - 1;
    bad = comm::world_rank_of(c, layout_) * world;
    c.pipeline = 0;
    bad += comm::world_rank_of(c, layout_);
  }
  groups_.world->allreduce(&bad, 1, DType::i64, comm::ReduceOp::max);
  if (bad < 0) return;
  std::ostringstream os;
  os << "parameters differ between ranks at step " << step << ": the copy of "
     << model::kEmbeddingTableName << " on rank " << bad / world << " (pipeline stage "
     << stages - 1 << ", read by " << (replicas_.tied ? "the tied head" : "the MTP module")
     << ") differs from the table on rank " << bad % world << " (stage 0)";
  throw CollectiveError(os.str(), kExitDiverged);
}

void ConsistencyChecker::check_experts(const model::ParamStore& ps,
                                       const std::vector<std::uint64_t>& mine,
                                       std::int64_t step) const {
  const model::ParamStore& whole = *replicas_.whole;
  comm::Communicator& group = *groups_.expert_data;
  // (A stage storing no own experts takes part with none.)
  const std::size_t first = replicas_.own_experts ? replicas_.own_experts_from : ps.size();
  const std::size_t P = ps.size() - first;
  const int n = group.size();
  std::vector<std::uint64_t> all(P * static_cast<std::size_t>(n));
  group.allgather(mine.data() + first, all.data(), P, DType::u64);
  std::vector<std::int64_t> world_of(static_cast<std::size_t>(n));
  const std::int64_t me = groups_.world->rank();
  group.allgather(&me, world_of.data(), 1, DType::i64);
  // The lowest tensor of the whole model whose replicas differ, over every expert slot.
  std::int64_t bad = kNone;
  std::vector<int> differ;
  for (std::size_t i = 0; i < P && bad == kNone; ++i) {
    for (int r = 1; r < n; ++r)
      if (all[static_cast<std::size_t>(r) * P + i] != all[i]) differ.push_back(r);
    if (!differ.empty()) bad = static_cast<std::int64_t>(whole.index_of(ps.spec(first + i).name));
  }
  std::int64_t lowest = bad;
  groups_.world->allreduce(&lowest, 1, DType::i64, comm::ReduceOp::min);
  if (lowest == kNone) return;
  // Its slot's ranks: 2 for the reference (the slot's lowest data rank), 1 for those differing.
  std::vector<std::int64_t> ranks(static_cast<std::size_t>(groups_.world->size()), 0);
  if (bad == lowest) {
    ranks[static_cast<std::size_t>(world_of[0])] = 2;
    for (const int r : differ)
      ranks[static_cast<std::size_t>(world_of[static_cast<std::size_t>(r)])] = 1;
  }
  groups_.world->allreduce(ranks.data(), ranks.size(), DType::i64, comm::ReduceOp::max);
  std::ostringstream os;
  os << "parameters differ between ranks at step " << step << ": first tensor "
     << whole.spec(static_cast<std::size_t>(lowest)).name;
  for (std::size_t r = 0; r < ranks.size(); ++r)
    if (ranks[r] == 2) os << " differs from rank " << r << "'s on rank";
  for (std::size_t r = 0; r < ranks.size(); ++r)
    if (ranks[r] == 1) os << " " << r;
  throw CollectiveError(os.str(), kExitDiverged);
}

}  // namespace dst::train
