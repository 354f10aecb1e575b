/// \file collectives.cpp
/// Deadline-bounded collectives of the checkpoint layer.
#include "ckpt/detail/collectives.hpp"

#include <limits>

#include "runtime/mpi_check.hpp"
#include "runtime/mpi_wait.hpp"

namespace dst::ckpt::detail {

Bounded::Bounded(MPI_Comm comm, double timeout_s, std::string what)
    : comm_(comm), timeout_s_(timeout_s), what_(std::move(what)) {
  DST_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  DST_MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

void Bounded::wait(MPI_Request& request, const char* op) {
  runtime::wait_with_deadline(request, timeout_s_, [&] {
    return what_ + ": " + op + " over " + std::to_string(size_) + " ranks";
  });
}

void Bounded::wait_all(std::vector<MPI_Request>& requests, const char* op) {
  for (auto& r : requests)
    wait(r, op);
}

void Bounded::agree(const std::optional<CheckpointError>& local) {
  if (auto e = agreed(local)) throw *e;
}

std::optional<CheckpointError> Bounded::agreed(const std::optional<CheckpointError>& local) {
  std::uint64_t first =
      local ? static_cast<std::uint64_t>(rank_) : static_cast<std::uint64_t>(size_);
  allreduce_u64(&first, 1, MPI_MIN);
  if (first == static_cast<std::uint64_t>(size_)) return std::nullopt;
  const int root = static_cast<int>(first);
  std::string message = rank_ == root ? local->what() : std::string();
  std::uint64_t kind = rank_ == root ? static_cast<std::uint64_t>(local->kind()) : 0;
  broadcast_u64(&kind, 1, root);
  broadcast(message, root);
  return CheckpointError(static_cast<CheckpointError::Kind>(kind),
                         "rank " + std::to_string(root) + ": " + message);
}

void Bounded::allreduce_u64(std::uint64_t* values, int count, MPI_Op op) {
  MPI_Request r;
  DST_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, values, count, MPI_UINT64_T, op, comm_, &r));
  wait(r, "allreduce");
}

void Bounded::allreduce_double(double* values, int count, MPI_Op op) {
  MPI_Request r;
  DST_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, values, count, MPI_DOUBLE, op, comm_, &r));
  wait(r, "allreduce");
}

void Bounded::broadcast_u64(std::uint64_t* values, int count, int root) {
  MPI_Request r;
  DST_MPI_CHECK(MPI_Ibcast(values, count, MPI_UINT64_T, root, comm_, &r));
  wait(r, "broadcast");
}

void Bounded::broadcast(std::string& text, int root) {
  std::uint64_t n = text.size();
  broadcast_u64(&n, 1, root);
  text.resize(n);
  if (n == 0) return;
  MPI_Request r;
  DST_MPI_CHECK(MPI_Ibcast(text.data(), static_cast<int>(n), MPI_CHAR, root, comm_, &r));
  wait(r, "broadcast");
}

std::vector<std::uint64_t> Bounded::allgather_u64(const std::vector<std::uint64_t>& mine) {
  std::vector<std::uint64_t> counts(size_);
  std::uint64_t n = mine.size();
  {
    MPI_Request r;
    DST_MPI_CHECK(MPI_Iallgather(&n, 1, MPI_UINT64_T, counts.data(), 1, MPI_UINT64_T, comm_, &r));
    wait(r, "allgather");
  }
  std::vector<int> icounts(size_), displs(size_);
  std::uint64_t total = 0;
  for (int i = 0; i < size_; ++i) {
    icounts[i] = static_cast<int>(counts[i]);
    displs[i] = static_cast<int>(total);
    total += counts[i];
  }
  std::vector<std::uint64_t> all(total);
  MPI_Request r;
  DST_MPI_CHECK(MPI_Iallgatherv(mine.data(), static_cast<int>(n), MPI_UINT64_T, all.data(),
                                icounts.data(), displs.data(), MPI_UINT64_T, comm_, &r));
  wait(r, "allgatherv");
  return all;
}

void Bounded::exchange_pieces(float* data, const std::vector<std::uint64_t>& offsets,
                              const std::vector<std::uint64_t>& counts) {
  std::vector<MPI_Request> requests;
  requests.reserve(size_);
  for (int root = 0; root < size_; ++root) {
    if (counts[root] == 0) continue;
    DST_REQUIRE(counts[root] <= static_cast<std::uint64_t>(std::numeric_limits<int>::max()),
                what_ << ": piece of " << counts[root] << " floats exceeds MPI's int count");
    requests.emplace_back();
    DST_MPI_CHECK(MPI_Ibcast(data + offsets[root], static_cast<int>(counts[root]), MPI_FLOAT, root,
                             comm_, &requests.back()));
  }
  wait_all(requests, "exchange of tensor pieces (broadcast)");
}

}  // namespace dst::ckpt::detail
