#pragma once
/// \file collectives.hpp
/// The few collectives of the checkpoint layer outside libhdf5: runtime::MpiCollectives
/// (each waited for against a deadline, so a missing rank ends in a TimeoutError naming
/// the operation instead of a hang) and the agreement on a CheckpointError.

#include <mpi.h>

#include <optional>
#include <string>

#include "ckpt/checkpoint.hpp"
#include "runtime/mpi_collectives.hpp"

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

/// The checkpoint layer's collectives over `comm` (runtime::MpiCollectives, named
/// "<what>: <op> over <n> ranks" in timeout messages), and its agreement on errors.
class Bounded : public runtime::MpiCollectives {
 public:
  /// `what` names the operation in timeout messages ("checkpoint save /x/step-3.h5").
  Bounded(MPI_Comm comm, double timeout_s, const std::string& what);

  /// Every rank throws the same CheckpointError when any rank passes one (the lowest
  /// failing rank's, its message prefixed "rank R: "); returns when none does.
  void agree(const std::optional<CheckpointError>& local);
  /// The same agreement, returned instead of thrown, for callers that clean up first.
  std::optional<CheckpointError> agreed(const std::optional<CheckpointError>& local);
};

}  // namespace dst::ckpt::detail
