#pragma once
/// \file nccl_bootstrap.hpp
/// The MPI side of the NCCL back end, free of NCCL and CUDA types so that it builds and
/// is tested in every configuration (docs/nccl.md):
/// - exchange_unique_id: group rank 0's NCCL unique id reaches every rank of the group
///   over the group's own MPI communicator, under a deadline;
/// - wait_for_init / wait_for_collective: polling loops over an abstract probe (in
///   production ncclCommGetAsyncError / cudaEventQuery) that end in a named error and a
///   call to an abort callback (in production ncclCommAbort) on timeout or failure.

#include <array>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "comm/communicator.hpp"

namespace dst::comm {

/// Size of ncclUniqueId (NCCL_UNIQUE_ID_BYTES in nccl.h, 128 since NCCL 2.0; the NCCL
/// back end checks the two agree at compile time).
inline constexpr std::size_t kNcclUniqueIdBytes = 128;

/// The opaque bytes of an ncclUniqueId.
using NcclUniqueIdBytes = std::array<char, kNcclUniqueIdBytes>;

/// Broadcasts `id` from rank 0 of `group` to every rank of it: on entry only group rank
/// 0's `id` matters (it made it with ncclGetUniqueId); on return every rank holds it.
/// Collective over `group` (an MPI communicator: the broadcast is an MPI collective on
/// it), recorded in the flight recorder as "nccl: unique id exchange on group '<name>'".
/// If it does not complete within `timeout_s` (> 0; <= 0: no deadline) it throws
/// dst::TimeoutError "NCCL unique id exchange on group '<name>' (<n> ranks) failed: ..."
/// with the broadcast's own report (waiting rank, step, flight recorder) after it; the
/// MPI broadcast is then left pending, so `id` must stay alive until the job ends (the
/// abort that follows such an error ensures that).
void exchange_unique_id(Communicator& group, NcclUniqueIdBytes& id, double timeout_s);

/// What one poll of an asynchronous NCCL operation found.
struct ProbeResult {
  enum class State { pending, ready, error };
  State state = State::pending;
  std::string error;  ///< with State::error: what failed (e.g. ncclGetErrorString + detail)

  static ProbeResult pending() { return {}; }
  static ProbeResult ready() { return {State::ready, {}}; }
  static ProbeResult failed(std::string text) { return {State::error, std::move(text)}; }
};

/// One poll; must be cheap and must not block (ncclCommGetAsyncError, cudaEventQuery).
using Probe = std::function<ProbeResult()>;
/// Ends the operation that will never complete (ncclCommAbort). Called at most once per
/// wait, before the error is thrown; if it throws, its message is appended to the error.
using AbortCallback = std::function<void()>;

/// Polls `probe` until it reports ready (returns), an error, or `timeout_s` (> 0; <= 0:
/// no deadline) passes. On an error or a timeout it calls `abort` once and throws:
///   dst::TimeoutError "ncclCommInitRankConfig on group 'tensor' (4 ranks) did not
///                      complete within 30 s at start-up (rank R waited; ...)"
///   dst::Error        "ncclCommInitRankConfig on group 'tensor' (4 ranks) failed: <text>"
/// both followed by "; the communicator was aborted" and the flight recorder's report.
/// Polls under core::PollPolicy::startup() (sleeps of up to 1 ms): initialisation takes tens of
/// milliseconds to seconds, so latency does not matter and the core is left to peers.
void wait_for_init(const Probe& probe, double timeout_s, const std::string& group_name,
                   int group_size, const AbortCallback& abort);

/// The same for an in-flight collective described by `describe()` ("nccl: allreduce(sum)
/// of ... on group 'data' (8 ranks)"); messages read "<describe()> did not complete within
/// T s ..." / "<describe()> failed: <text>". Polls yield for the first second (a GPU
/// collective's completion is worth noticing within microseconds: the next bucket waits
/// for it), then back off to sleeps of up to 100 us: core::PollPolicy::collective(), as
/// every collective wait.
void wait_for_collective(const Probe& probe, double timeout_s,
                         const std::function<std::string()>& describe, const AbortCallback& abort);

/// The communicator a trainer sums device-resident gradients over (parallel.backend
/// nccl): in DSTRAIN_ENABLE_NCCL builds make_nccl_communicator over the ranks of
/// `mpi_group`, named `name`, whose collectives wait for the work enqueued on
/// `compute_stream` (a cudaStream_t) before they start. In other builds it throws
/// dst::Error saying so (runtime::resolve_backends refuses 'nccl' there first).
/// Collective over `mpi_group`.
std::unique_ptr<Communicator> make_device_communicator(Communicator& mpi_group, std::string name,
                                                       double timeout_s, double init_timeout_s,
                                                       void* compute_stream);

}  // namespace dst::comm
