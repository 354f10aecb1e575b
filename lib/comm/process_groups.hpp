#pragma once
/// \file process_groups.hpp
/// Data, tensor and pipeline parallel groups, made by splitting the world by the deck's
/// layout.
///
/// Rank order (as Megatron-LM lays ranks out, so tensor-parallel peers, which talk most,
/// are neighbours and share a node):
///   world_rank = (pipeline_rank * data + data_rank) * tensor + tensor_rank
/// i.e. tensor varies fastest, then data, then pipeline. Each group holds the ranks that
/// differ only in its own coordinate, ordered by that coordinate, so a rank's position in
/// its data group is its data_rank, and so on.

#include <mpi.h>

#include <memory>

#include "comm/communicator.hpp"
#include "config/run_config.hpp"

namespace dst::comm {

/// A rank's coordinates in the (pipeline, data, tensor) grid.
struct RankCoords {
  int data = 0;
  int tensor = 0;
  int pipeline = 0;
};

/// Coordinates of `world_rank` under `layout` (see the rank order above).
RankCoords rank_coords(int world_rank, const config::Layout& layout);
/// Inverse of rank_coords.
int world_rank_of(const RankCoords& coords, const config::Layout& layout);

/// The communicators of one rank. Every group is a real MPI communicator (a split of the
/// world), also those of size 1, so code paths are the same at every layout.
struct ProcessGroups {
  std::unique_ptr<Communicator> world;     ///< every rank, named "world"
  std::unique_ptr<Communicator> data;      ///< same (pipeline, tensor), named "data"
  std::unique_ptr<Communicator> tensor;    ///< same (pipeline, data), named "tensor"
  std::unique_ptr<Communicator> pipeline;  ///< same (data, tensor), named "pipeline"
  /// Expert parallelism (parallel.expert = X, layout.expert): the X consecutive data ranks
  /// data_rank / X * X .. + X - 1 of this rank's data group, named "expert" (its routed
  /// experts are split over them; rank order = data_rank % X), and the data ranks holding
  /// the same experts (equal data_rank % X), named "expert_data" (rank order =
  /// data_rank / X). X = 1: "expert" is this rank alone and "expert_data" the data group.
  std::unique_ptr<Communicator> expert;
  std::unique_ptr<Communicator> expert_data;
  /// Tensor parallelism with replicated key/value heads (layout.kv_replicas = R > 1): the
  /// R consecutive ranks of this rank's tensor group that hold the same heads, tensor_rank
  /// / R * R .. + R - 1, named "kv_replica" (rank order = tensor_rank % R). R = 1: this
  /// rank alone.
  std::unique_ptr<Communicator> kv_replica;
  int data_rank = 0;
  int tensor_rank = 0;
  int pipeline_rank = 0;
  int expert_rank = 0;  ///< position in the expert group (data_rank % X)
  /// Group sizes of the layout the groups were made for (verify_process_groups uses them).
  int data_size = 1;
  int tensor_size = 1;
  int pipeline_size = 1;
  int expert_size = 1;
};

/// Splits `world` (duplicated; the caller keeps ownership) into the groups of `layout`.
/// Throws dst::Error if a group size is < 1, data*tensor*pipeline differs from the size of
/// `world`, layout.world_size differs from it, or a split yields an unexpected size or rank.
/// Collective over `world`. `timeout_s` becomes the deadline of every group's waits.
ProcessGroups make_process_groups(MPI_Comm world, const config::Layout& layout, double timeout_s);

/// The start-up test collective: on every group an allreduce(sum) of 1 must equal the
/// group's size, and an allgather of world ranks must list exactly the expected members
/// in rank order. Throws dst::Error naming the group and what differed (or
/// dst::TimeoutError if a peer does not take part). Collective over every group.
void verify_process_groups(ProcessGroups& groups);

}  // namespace dst::comm
