#pragma once
/// \file zero_shards.hpp
/// Which contiguous range of the flat parameter buffer each data rank owns under ZeRO
/// (parallel.zero_stage >= 1, docs/performance.md "ZeRO"): the AdamW moments exist only
/// for it, its gradients are the ones a rank receives from the reduce-scatter, and it is
/// the part of the parameters a rank updates and all-gathers.

#include <cstddef>
#include <vector>

#include "model/param_store.hpp"

namespace dst::train {

class ZeroShards {
 public:
  /// Shards made of whole tensors (the MPI back end): the boundary between rank k - 1 and
  /// k is the tensor start nearest to k/N of the buffer (the lower one on a tie), so every
  /// tensor's gradient is summed onto one rank and its norm is computed there exactly as
  /// without ZeRO (the same bits). The padding after a tensor belongs to that tensor's
  /// shard. Shards differ from 1/N by up to half the largest tensor; a rank whose 1/N
  /// falls inside one large tensor may own nothing (an empty shard is valid everywhere).
  static ZeroShards by_tensors(const model::ParamStore& store, int ranks);
  /// The same over the elements [begin, end) of the buffer only, whose tensors (those
  /// starting there) it shards; offsets relative to `begin`. Expert parallelism's two
  /// parts of the buffer: the replicated tensors over the data group, the rank's own
  /// experts (the last tensors) over the expert-data group.
  static ZeroShards by_tensors(const model::ParamStore& store, int ranks, std::size_t begin,
                               std::size_t end);
  /// The parts of comm::SharedSum::part_of (the shm back end, whose ranks already update
  /// these parts of the shared parameters): whole 64-byte lines, not tensors.
  static ZeroShards by_parts(std::size_t elements, int ranks);

  int ranks() const { return static_cast<int>(bounds_.size()) - 1; }
  std::size_t elements() const { return bounds_.back(); }
  /// Rank r's shard is [first(r), last(r)).
  std::size_t first(int r) const { return bounds_.at(static_cast<std::size_t>(r)); }
  std::size_t last(int r) const { return bounds_.at(static_cast<std::size_t>(r) + 1); }
  /// The elements of [begin, end) in each rank's shard, in rank order (they add up to
  /// end - begin): the blocks of a reduce-scatter or all-gather of that range.
  std::vector<std::size_t> counts(std::size_t begin, std::size_t end) const;
  /// Every rank's whole shard: the blocks of the whole buffer.
  std::vector<std::size_t> sizes() const { return counts(0, elements()); }

 private:
  explicit ZeroShards(std::vector<std::size_t> bounds) : bounds_(std::move(bounds)) {}
  std::vector<std::size_t> bounds_;  ///< (ranks + 1) non-decreasing, 0 .. elements
};

}  // namespace dst::train
