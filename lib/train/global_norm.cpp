#include "train/global_norm.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "core/error.hpp"

namespace dst::train {

GlobalNorm::GlobalNorm(Parts parts) : parts_(std::move(parts)) {
  const Parts& p = parts_;
  if (p.own_experts_from != kNone && !p.expert)
    throw Error("global norm: own experts without an expert group");
  if (p.pipeline) {
    if (p.stage_sizes.size() != static_cast<std::size_t>(p.pipeline->size()))
      throw Error("global norm: " + std::to_string(p.stage_sizes.size()) + " stage sizes for " +
                  std::to_string(p.pipeline->size()) + " stages");
    std::size_t total = 0;
    for (const std::size_t n : p.stage_sizes)
      total += n;
    if (p.model_index.size() != total)
      throw Error("global norm: " + std::to_string(p.model_index.size()) +
                  " whole-model indices for the stages' " + std::to_string(total) + " tensors");
    if (p.own_experts_from != kNone && p.stage_index.empty())
      throw Error("global norm: own experts on stages need the store's stage indices");
  }
}

double GlobalNorm::sum_of_squares(const model::ParamStore& ps, std::vector<double> per_tensor,
                                  double local) const {
  const Parts& p = parts_;
  if (per_tensor.size() != ps.size())
    throw Error("global norm: " + std::to_string(per_tensor.size()) + " sums for a store of " +
                std::to_string(ps.size()) + " tensors");
  double sum = local;
  if (p.tensor) {
    // Each split tensor's sum over its slices, a replicated tensor's once (its copies are
    // equal), a slice shared by R ranks (key/value heads) once, from the first of them:
    // one all-reduce over the tensor group, in the store's order (before the own experts'
    // sums below, which the tensor slices take alike).
    for (std::size_t i = 0; i < per_tensor.size(); ++i)
      if ((ps.spec(i).split == model::Split::replicated && p.tensor_rank != 0) ||
          p.tensor_rank % ps.spec(i).tp_replicas != 0)
        per_tensor[i] = 0.0;
    p.tensor->allreduce(per_tensor.data(), per_tensor.size(), DType::f64, comm::ReduceOp::sum);
    sum = 0.0;
    for (const double v : per_tensor)
      sum += v;
  }
  const bool experts = p.own_experts_from != kNone;
  if (experts && !p.pipeline) {
    double replicated = 0.0, own = 0.0;
    for (std::size_t i = 0; i < per_tensor.size(); ++i)
      (i < p.own_experts_from ? replicated : own) += per_tensor[i];
    p.expert->allreduce(&own, 1, DType::f64, comm::ReduceOp::sum);
    sum = replicated + own;
  }
  if (!p.pipeline) return sum;
  const auto stage = static_cast<std::size_t>(p.pipeline->rank());
  if (experts) {
    // In the stage's whole layout (every expert): each own expert's sum from its holder,
    // summed over the expert group (the others add +0), so that every rank of the stage
    // has every tensor's, as the stages' gather below needs.
    const std::size_t n = p.stage_sizes[stage];
    std::vector<double> whole(n, 0.0), own(n, 0.0);
    for (std::size_t i = 0; i < per_tensor.size(); ++i)
      (i < p.own_experts_from ? whole : own)[p.stage_index.at(i)] = per_tensor[i];
    p.expert->allreduce(own.data(), n, DType::f64, comm::ReduceOp::sum);
    for (std::size_t i = 0; i < n; ++i)
      whole[i] += own[i];
    per_tensor = std::move(whole);
  }
  if (per_tensor.size() != p.stage_sizes[stage])
    throw Error("global norm: stage " + std::to_string(stage) + " has " +
                std::to_string(per_tensor.size()) + " tensors, its layout " +
                std::to_string(p.stage_sizes[stage]));
  // Every stage's per-tensor sums (one all-gather over the pipeline group), added in the
  // whole model's order: a one-stage run's bits.
  std::vector<double> all(p.model_index.size());
  std::size_t at = 0;
  for (std::size_t s = 0; s < stage; ++s)
    at += p.stage_sizes[s];
  std::copy(per_tensor.begin(), per_tensor.end(), all.begin() + static_cast<std::ptrdiff_t>(at));
  p.pipeline->iallgather_blocks(all.data(), p.stage_sizes, DType::f64).wait();
  std::vector<double> in_order(all.size());
  for (std::size_t i = 0; i < all.size(); ++i)
    if (p.model_index[i] != kNone) in_order[p.model_index[i]] = all[i];
  sum = 0.0;
  for (const double v : in_order)
    sum += v;
  return sum;
}

}  // namespace dst::train
