#pragma once
/// \file moe_dispatch.hpp
/// Expert parallelism (parallel.expert = P > 1): the routed experts of every MoE layer are
/// split over an expert group of P ranks, rank p owning experts [p L, (p+1) L), L = E / P.
/// After routing, each rank's (token, slot) rows, sorted by expert and so by owner rank,
/// go to their experts' ranks:
///   1. an all-to-all of the per-expert row counts (L per rank pair),
///   2. an all-to-all-v of the rows' activations (C floats a row),
///   3. on each rank, the rows received re-ordered expert-major (for each local expert,
///      the rows of rank 0, then 1, ...) and one grouped SwiGLU product per local expert
///      (an expert without rows is skipped),
///   4. the reverse all-to-all-v of the experts' outputs, back into the sender's sorted
///      order, where the layer combines them with the gate weights as without parallelism.
/// Backward mirrors it: the outputs' gradients go out as the inputs did (a dispatch), the
/// rows' input gradients come back (a combine). Dropless: every row reaches its expert,
/// whatever the imbalance (the receive buffers grow to fit).
///
/// Storage: built for expert rank p of P (ExpertSlice, the model's constructor argument),
/// an MoE layer declares and holds only its local experts [p L, (p+1) L), under their
/// global names (model.layers.N.mlp.experts.<global id>.*), with their gradients and AdamW
/// moments: 1/P of the routed experts' state per rank. Those tensors are marked
/// (ParamSpec::ep_size) and laid out after every other tensor of the store, so that the
/// trainer sums the gradients of the first region over the data group and those of the
/// experts' region over the ranks holding the same experts (process_groups' "expert_data"
/// group), and a checkpoint gathers each expert whole from its owner (train/trainer.cpp).
/// The router (gate.weight, its correction bias) and the shared experts stay replicated.
/// The state is host memory: a model on a device refuses expert parallelism (Moe::experts_forward).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/communicator.hpp"

namespace dst::model {

/// A rank's place in its expert group (parallel.expert): it holds the routed experts
/// [rank L, (rank+1) L) of every MoE layer, L = n_routed_experts / size.
struct ExpertSlice {
  int rank = 0;
  int size = 1;
};

/// The all-to-all traffic of the MoE layers since the last reset (metrics).
struct ExpertTraffic {
  double seconds = 0.0;              ///< wall time in the all-to-alls (counts and rows)
  std::uint64_t bytes_sent = 0;      ///< row and count bytes this rank sent
  std::uint64_t bytes_received = 0;  ///< and received
  std::uint64_t rows_received = 0;   ///< (token, slot) rows this rank's experts computed
  std::int64_t exchanges = 0;        ///< all-to-all-v calls
};

/// One rank's view of its expert group: the communicator and the traffic it carried.
class ExpertParallel {
 public:
  /// `group`: the expert group (process_groups' "expert"); outlives this object.
  explicit ExpertParallel(comm::Communicator& group) : group_(group) {}
  int size() const { return group_.size(); }
  int rank() const { return group_.rank(); }

  /// All-to-all of `per_rank` counts to each rank: send (size() x per_rank) -> recv.
  void exchange_counts(const std::int64_t* send, std::int64_t* recv, std::size_t per_rank);
  /// All-to-all-v of rows of `width` floats: send_rows[r] rows to rank r, recv_rows[q]
  /// from rank q, both in rank order. Throws dst::TimeoutError past the group's deadline
  /// (the message names "alltoallv").
  void exchange_rows(const float* send, const std::vector<std::size_t>& send_rows, float* recv,
                     const std::vector<std::size_t>& recv_rows, std::int64_t width);
  /// exchange_rows() in two halves, so that work can run while the rows travel (as far as
  /// the back end progresses without being polled: Open MPI's shared memory moves what
  /// fits its eager buffers at the start). finish_rows() waits (the group's deadline).
  comm::Request start_rows(const float* send, const std::vector<std::size_t>& send_rows,
                           float* recv, const std::vector<std::size_t>& recv_rows,
                           std::int64_t width);
  void finish_rows(comm::Request& request);

  const ExpertTraffic& traffic() const { return traffic_; }
  ExpertTraffic& traffic() { return traffic_; }
  void reset_traffic() { traffic_ = ExpertTraffic{}; }
  /// Fault injection (debug.inject_hang_alltoallv_rank): the next exchange_rows() hangs
  /// this rank forever before it starts, so that its peers wait in the all-to-all-v.
  void hang_before_next_rows() { hang_ = true; }

 private:
  comm::Communicator& group_;
  ExpertTraffic traffic_;
  bool hang_ = false;
};

/// Node-limited routing's node map (model.moe.max_nodes_per_token): the node of each of
/// `experts` routed experts. `pretend` > 0 (debug.expert_nodes): `pretend` equal nodes in
/// expert order, whatever the hosts. Else, with an expert group `group` of P > 1 ranks,
/// rank p's experts [p L, (p+1) L) lie on its host's node, nodes numbered by their first
/// rank in the group (an all-gather of the host names, collective over `group`, with its
/// deadline). Else (no group, or one rank): every expert on one node, returned empty.
std::vector<std::int32_t> expert_nodes(std::int64_t experts, std::int64_t pretend,
                                       comm::Communicator* group);

/// The dispatch of one MoE layer's last forward, kept for its backward (host memory).
struct ExpertDispatch {
  std::int64_t P = 1, L = 0;               ///< group size, experts per rank
  std::vector<std::int64_t> send_counts;   ///< (P L) rows this rank sends to each expert
  std::vector<std::int64_t> recv_counts;   ///< (P L) rows from rank q for local expert l at q L + l
  std::vector<std::size_t> send_rows;      ///< (P) rows to each rank
  std::vector<std::size_t> recv_rows;      ///< (P) rows from each rank
  std::vector<std::int64_t> local_offset;  ///< (L + 1) local expert l's rows, expert-major
  std::vector<std::int64_t> source_row;    ///< (R) expert-major row i = received row source_row[i]
  std::int64_t rows = 0;                   ///< R: rows received
  // The expert side, R rows: inputs, SwiGLU products, outputs; the backward's gradients.
  std::vector<float> xs, h1, h3, g, y, d_g, d_y, d_xs;
  std::vector<float> stage;  ///< (R, C) rows in the received (source-major) order

  /// From the sender's per-expert row counts (E = P L): the count exchange, the receive
  /// layout and the expert-major order. Collective over the group.
  void plan(ExpertParallel& ep, const std::vector<std::int64_t>& offset, std::int64_t experts);
  /// The sender's rows (sorted by expert) to the experts' ranks, into `out` (R, width)
  /// expert-major. Collective.
  void dispatch(ExpertParallel& ep, const float* rows, float* out, std::int64_t width);
  /// dispatch() with `overlap` run while the rows travel (the shared experts' product).
  void dispatch(ExpertParallel& ep, const float* rows, float* out, std::int64_t width,
                const std::function<void()>& overlap);
  /// The expert-major rows `in` (R, width) back to their senders, into `rows` in the
  /// sender's sorted order. Collective.
  void combine(ExpertParallel& ep, const float* in, float* rows, std::int64_t width);
};

}  // namespace dst::model
