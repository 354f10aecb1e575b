#pragma once
/// \file mpi_collectives.hpp
/// Deadline-bounded collectives over a raw MPI communicator, for the code that runs before
/// comm's communicators exist (start-up, the deck) or that works on an MPI_Comm of its own
/// (dataset open, prep, the checkpoint layer beside libhdf5's MPI-IO). Everything else
/// uses comm::Communicator. Each collective is started non-blocking and waited for with
/// wait_with_deadline (mpi_wait.hpp), so a missing rank ends in a TimeoutError naming the
/// operation instead of a hang: no blocking MPI collective is called anywhere else.

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace dst::runtime {

/// What one rank (the root) produced for all: its text, or the message of its failure.
struct RootResult {
  bool ok = true;
  std::string text;  ///< the payload when ok; the root's error message otherwise
};

/// Runs `produce`, returning its text, or ok = false with the message of whatever it
/// threw (any std::exception: also bad_alloc and filesystem errors must reach the ranks
/// that wait for the result).
RootResult attempt(const std::function<std::string()>& produce);

/// The lowest failing rank of an agreement and its message.
struct Failure {
  int rank = 0;
  std::string message;
};

/// Collectives over `comm`, each bounded by one deadline.
class MpiCollectives {
 public:
  /// Names an operation in timeout messages, given the name a call passes: the message
  /// reads "<describe(op)> did not complete within T s at <step> (rank R waited; ...)".
  using Describe = std::function<std::string(const std::string& op)>;

  /// `timeout_s` bounds each wait (<= 0: none).
  MpiCollectives(MPI_Comm comm, double timeout_s, Describe describe);

  int rank() const { return rank_; }
  int size() const { return size_; }

  /// In place: every rank ends with `op` over all ranks' values[0:count).
  void allreduce(void* values, int count, MPI_Datatype type, MPI_Op op,
                 const std::string& name = "allreduce");
  /// values[0:count) of `root` reach every rank.
  void broadcast(void* values, int count, MPI_Datatype type, int root,
                 const std::string& name = "broadcast");
  /// `root`'s text reaches every rank (its length, then its bytes).
  void broadcast(std::string& text, int root, const std::string& name = "broadcast");
  /// `root` receives every rank's send[0:count) in `recv` (size() * count, by rank).
  void gather(const void* send, int count, MPI_Datatype type, void* recv, int root,
              const std::string& name = "gather");
  /// `root` receives rank r's send[0:count) at recv + displs[r] (counts[r] elements); the
  /// counts and displacements matter on the root only.
  void gatherv(const void* send, int count, MPI_Datatype type, void* recv, const int* counts,
               const int* displs, int root, const std::string& name = "gatherv");
  /// Every rank's `mine` concatenated in rank order, on every rank.
  std::vector<std::uint64_t> allgather_u64(const std::vector<std::uint64_t>& mine,
                                           const std::string& name = "allgather");
  /// Rank r's piece [offsets[r], offsets[r] + counts[r]) of `data` is copied to every rank
  /// (one broadcast per rank, all started, then waited). Counts must fit MPI's int.
  void exchange_pieces(float* data, const std::vector<std::uint64_t>& offsets,
                       const std::vector<std::uint64_t>& counts, const std::string& name);

  /// Agreement on failure: each rank passes its error message, or nullopt when it
  /// succeeded. Returns nullopt on every rank when none failed; else, on every rank, the
  /// lowest failing rank and its message (sent by it).
  std::optional<Failure> first_failure(const std::optional<std::string>& mine,
                                       const std::string& name = "agreement");
  /// How many ranks pass `failed` = true (an allreduce).
  int count_failed(bool failed, const std::string& name = "agreement");

  /// "Rank `root` does the work, every rank gets the result": `mine` (what attempt()
  /// returned on the root; ignored elsewhere) reaches every rank, result or error alike,
  /// so no rank is left waiting when the root fails. The waits are named
  /// "<name> (header)" and "<name> (<n> B)".
  RootResult broadcast_result(const RootResult& mine, int root, const std::string& name);

 private:
  void wait(MPI_Request& request, const std::string& name);

  MPI_Comm comm_;
  double timeout_s_;
  Describe describe_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace dst::runtime
