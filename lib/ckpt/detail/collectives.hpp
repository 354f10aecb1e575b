#pragma once
/// \file collectives.hpp
/// The few collectives of the checkpoint layer outside libhdf5, each non-blocking and
/// waited for against a deadline (runtime/mpi_wait.hpp), so a missing rank ends in a
/// TimeoutError naming the operation instead of a hang.

#include <mpi.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/checkpoint.hpp"

namespace dst::ckpt::detail {

/// Runs `f`, returning the CheckpointError it throws (any other dst::Error or std
/// exception becomes CheckpointError(io) with its message), for Bounded::agree. A
/// TimeoutError passes through: a missed deadline ends the job, it is not agreed upon.
template <class F>
std::optional<CheckpointError> capture(F&& f) {
  try {
    f();
    return std::nullopt;
  } catch (const CheckpointError& e) {
    return e;
  } catch (const TimeoutError&) {
    throw;
  } catch (const std::exception& e) {
    return CheckpointError(CheckpointError::Kind::io, e.what());
  }
}

class Bounded {
 public:
  /// `what` names the operation in timeout messages ("checkpoint save /x/step-3.h5").
  Bounded(MPI_Comm comm, double timeout_s, std::string what);

  int rank() const { return rank_; }
  int size() const { return size_; }

  /// Every rank throws the same CheckpointError when any rank passes one (the lowest
  /// failing rank's, its message prefixed "rank R: "); returns when none does.
  void agree(const std::optional<CheckpointError>& local);
  /// The same agreement, returned instead of thrown, for callers that clean up first.
  std::optional<CheckpointError> agreed(const std::optional<CheckpointError>& local);

  /// In place over `count` u64 / double values.
  void allreduce_u64(std::uint64_t* values, int count, MPI_Op op);
  void allreduce_double(double* values, int count, MPI_Op op);
  void broadcast(std::string& text, int root);
  void broadcast_u64(std::uint64_t* values, int count, int root);
  /// Every rank's `mine` concatenated in rank order.
  std::vector<std::uint64_t> allgather_u64(const std::vector<std::uint64_t>& mine);
  /// Rank r's piece [offset_r, offset_r + count_r) of `data` is copied to every rank
  /// (one broadcast per rank, all started, then waited). Counts must fit MPI's int.
  void exchange_pieces(float* data, const std::vector<std::uint64_t>& offsets,
                       const std::vector<std::uint64_t>& counts);

 private:
  void wait(MPI_Request& request, const char* op);
  void wait_all(std::vector<MPI_Request>& requests, const char* op);

  MPI_Comm comm_;
  double timeout_s_;
  std::string what_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace dst::ckpt::detail
