/// \file collectives.cpp
/// The checkpoint layer's collectives and its agreement on errors.
#include "ckpt/detail/collectives.hpp"

#include <cstdint>

#include "runtime/mpi_check.hpp"

namespace dst::ckpt::detail {

namespace {

runtime::MpiCollectives::Describe describe_as(MPI_Comm comm, const std::string& what) {
  int size = 1;
  DST_MPI_CHECK(MPI_Comm_size(comm, &size));
  return [what, size](const std::string& op) {
    return what + ": " + op + " over " + std::to_string(size) + " ranks";
  };
}

}  // namespace

Bounded::Bounded(MPI_Comm comm, double timeout_s, const std::string& what)
    : MpiCollectives(comm, timeout_s, describe_as(comm, what)) {}

void Bounded::agree(const std::optional<CheckpointError>& local) {
  if (auto e = agreed(local)) throw *e;
}

std::optional<CheckpointError> Bounded::agreed(const std::optional<CheckpointError>& local) {
  const auto failure =
      first_failure(local ? std::optional<std::string>(local->what()) : std::nullopt);
  if (!failure) return std::nullopt;
  std::uint64_t kind = rank() == failure->rank ? static_cast<std::uint64_t>(local->kind()) : 0;
  broadcast(&kind, 1, MPI_UINT64_T, failure->rank);
  return CheckpointError(static_cast<CheckpointError::Kind>(kind),
                         "rank " + std::to_string(failure->rank) + ": " + failure->message);
}

}  // namespace dst::ckpt::detail
