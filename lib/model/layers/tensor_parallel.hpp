#pragma once
/// \file tensor_parallel.hpp
/// Tensor parallelism (parallel.tensor = T > 1), Megatron-LM's layout (Shoeybi et al. 2019):
/// each rank of a tensor group holds slice `rank` of T of every split parameter
/// (param_store.hpp, Split) and computes the part of each layer that slice gives:
///   attention: heads [rank H/T, (rank+1) H/T) (q, k, v by output rows, o_proj by input
///              columns; kv heads split alike when T | n_kv_heads KV; when KV | T and
///              T > KV, as Megatron-LM does, each rank holds the one kv head g = rank /
///              (T/KV) its query heads read, replicated on the T/KV ranks of that head,
///              whose shares of its activation gradients the "kv_replica" group sums);
///   latent attention: heads likewise (q_proj / q_b_proj, kv_b_proj by rows, o_proj by
///              columns), the latents' projections and norms replicated, their gradients
///              summed over the group (latent_attention.hpp);
///   MLP:       the ffn columns [rank F/T, ..) (gate, up by rows, down by columns);
///   DeepSeekMoE: not split: each rank computes the MoE layer whole (block.hpp);
///   embedding: the vocabulary rows [rank V/T, ..) (a token elsewhere contributes zeros);
///   head:      the logits of those rows, and a cross-entropy over the split vocabulary
///              that never gathers them (vocab_parallel.hpp).
/// The outputs of o_proj, down_proj and the embedding are partial sums over the group, and
/// so are the input gradients of q/k/v, gate/up and the lm head: one all-reduce each
/// (all_reduce below) makes them whole on every rank, after which the norms, the residual
/// stream and everything replicated compute alike on every rank of the group.
/// Sequence parallelism (TensorSlice::sequence; Korthikanti et al. 2022) splits that
/// replicated part by token rows instead: each block all-gathers its norms' rows before
/// the attention and the MLP and reduce-scatters their partial sums after (TokenRows,
/// token_rows.hpp).
///
/// The collectives below take f32 tensors in host memory over the group's communicator
/// (LanguageModel::set_tensor_parallel refuses a model on a device); each carries the
/// group's deadline.

#include <chrono>
#include <cstdint>

#include "comm/communicator.hpp"
#include "tensor/tensor.hpp"

namespace dst::model {

/// A rank's place in its tensor group: slice `rank` of `size`.
struct TensorSlice {
  int rank = 0;
  int size = 1;
  /// Sequence parallelism (parallel.sequence_parallel, block.hpp): between the attention
  /// and MLP parts, each rank keeps token rows [rank N/size, (rank+1) N/size) of the N rows
  /// of a micro-batch (the residual stream and the blocks' norms); size 1: nothing.
  bool sequence = false;
  /// The share of the token rows a rank keeps between the layers' parts: size under
  /// sequence parallelism, else 1.
  int row_split() const { return sequence ? size : 1; }
};

/// The collectives the layers did since the last reset (metrics).
struct TensorTraffic {
  double seconds = 0.0;  ///< wall time in them
  /// All-reduce-equivalent volume: an all-reduce counts its buffer's size once; a
  /// reduce-scatter or an all-gather counts half of its whole (gathered) buffer, since a
  /// ring moves half an all-reduce's bytes in each (the two halves of one all-reduce), so
  /// a reduce-scatter plus an all-gather of the same rows count as one all-reduce of them.
  std::uint64_t bytes = 0;
  std::int64_t calls = 0;
};

/// One rank's view of its tensor group: the communicator and the traffic it carried.
class TensorParallel {
 public:
  /// `group`: the tensor group (process_groups' "tensor"); `kv_replicas`: the ranks of it
  /// holding the same key/value heads (process_groups' "kv_replica"), nullptr or a group
  /// of one when none are shared. Both outlive this object.
  explicit TensorParallel(comm::Communicator& group, comm::Communicator* kv_replicas = nullptr)
      : group_(group), kv_replicas_(kv_replicas) {}
  int size() const { return group_.size(); }
  int rank() const { return group_.rank(); }
  TensorSlice slice() const { return {rank(), size()}; }
  comm::Communicator& group() { return group_; }

  /// t (f32, host memory) = the sum of every rank's t, in place, on every rank. Throws
  /// dst::TimeoutError past the group's deadline.
  void all_reduce(const tensor::Tensor& t);
  /// The same over the ranks sharing this rank's key/value heads (counted as this group's
  /// traffic); nothing when they are not shared.
  void all_reduce_kv_replicas(const tensor::Tensor& t);
  /// Split by rows (dimension 0; sequence parallelism): `local` (f32, host, rows/T rows)
  /// = rows [rank R, (rank+1) R) of the sum of every rank's `whole` (R = whole's rows / T).
  /// Throws dst::Error unless T divides whole's rows and local has R rows of the same
  /// width; dst::TimeoutError past the group's deadline.
  void reduce_scatter(const tensor::Tensor& whole, const tensor::Tensor& local);
  /// The inverse split: `whole` = every rank's `local` stacked by rank (rank r's rows at
  /// [r R, (r+1) R)), on every rank. Same checks and deadline as reduce_scatter.
  void all_gather(const tensor::Tensor& local, const tensor::Tensor& whole);
  /// Runs `collectives` (over group(), moving `bytes`: the vocabulary-parallel embedding
  /// and cross-entropy) and counts them as this group's traffic.
  template <class F>
  void counted(std::uint64_t bytes, F&& collectives) {
    const auto t0 = std::chrono::steady_clock::now();
    collectives();
    traffic_.seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    traffic_.bytes += bytes;
    ++traffic_.calls;
  }

  const TensorTraffic& traffic() const { return traffic_; }
  void reset_traffic() { traffic_ = TensorTraffic{}; }

 private:
  comm::Communicator& group_;
  comm::Communicator* kv_replicas_;
  TensorTraffic traffic_;
};

}  // namespace dst::model
