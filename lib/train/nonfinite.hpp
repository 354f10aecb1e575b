#pragma once
/// \file nonfinite.hpp
/// Names where a step's gradients became non-finite, the same way in every layout: the
/// lowest world rank whose own gradient (before the sums) held a NaN or an infinity, with
/// its tensor in the whole model and the element within it; or, when no rank's own
/// gradient did (the sums overflowed), the lowest tensor of the whole model whose summed
/// gradient does, over the ranks holding the sums.

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.hpp"
#include "config/run_config.hpp"
#include "model/param_store.hpp"
#include "tensor/context.hpp"

namespace dst::train {

/// The flat-buffer offset of the tensor of `ps` holding element `offset`: the last one
/// starting at or before it.
std::size_t tensor_at(const model::ParamStore& ps, std::size_t offset);

class NonFiniteNamer {
 public:
  /// Over the ranks of `world` laid out as `layout`; `whole` is the whole model's layout
  /// (names and whole shapes), which the stores of every rank are parts of. Both must
  /// outlive the namer.
  NonFiniteNamer(comm::Communicator& world, const config::Layout& layout,
                 const model::ParamStore& whole);

  /// "first on rank R[ (pipeline stage S, tensor slice T)], tensor NAME[i]" or "no rank's
  /// own gradient was non-finite (the sum overflowed); first tensor NAME" ("?" if no summed
  /// gradient this rank holds is non-finite either). `ps`: this rank's store, `ctx` the
  /// memory it lives in; `first_offset`: this rank's first non-finite element of its own
  /// gradient (a flat offset of `ps`), or -1; `summed`: the ranges [first, last) of the
  /// flat buffer whose summed gradients this rank holds (the tensors starting there; ZeRO:
  /// its shards). Collective over `world` (two all-reduces); the same text on every rank.
  std::string name(const model::ParamStore& ps, const tensor::ExecContext& ctx,
                   std::int64_t first_offset,
                   const std::vector<std::pair<std::size_t, std::size_t>>& summed) const;

 private:
  comm::Communicator& world_;
  config::Layout layout_;
  const model::ParamStore& whole_;
};

}  // namespace dst::train
