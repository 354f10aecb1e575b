#include "comm/nccl_bootstrap.hpp"

#include <mpi.h>

#include <exception>
#include <sstream>

#include "core/deadline.hpp"
#include "core/error.hpp"
#include "core/flight_recorder.hpp"
#include "core/poll_policy.hpp"
#include "core/step_context.hpp"
#include "runtime/mpi_check.hpp"

#if DSTRAIN_HAVE_NCCL
#include "comm/nccl_communicator.hpp"
#endif

namespace dst::comm {

namespace {

std::string group_text(const std::string& name, int size) {
  return "group '" + name + "' (" + std::to_string(size) + (size == 1 ? " rank)" : " ranks)");
}

/// World rank for messages; -1 when MPI is not running (the probes need no MPI).
int world_rank() {
  int rank = -1;
  if (runtime::mpi_is_up()) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

/// Calls `abort` and returns "" or, if it failed, a sentence to append to the error.
std::string run_abort(const AbortCallback& abort) {
  if (!abort) return "";
  try {
    abort();
    return "";
  } catch (const std::exception& e) {
    return " (aborting it failed too: " + std::string(e.what()) + ")";
  } catch (...) {
    return " (aborting it failed too: unknown exception)";
  }
}

void wait_for_probe(const Probe& probe, double timeout_s,
                    const std::function<std::string()>& describe, const AbortCallback& abort,
                    const core::PollPolicy& policy) {
  DST_REQUIRE(probe, "comm: waiting for an NCCL operation without a probe");
  const core::Deadline deadline(timeout_s);
  const auto ready = [&] {
    ProbeResult r = probe();
    if (r.state == ProbeResult::State::error) {
      // Abort first: the communicator is unusable, and NCCL's own threads may be stuck
      // waiting for peers that ncclCommAbort releases.
      const std::string abort_note = run_abort(abort);
      throw Error(describe() + " failed: " + r.error + "; the communicator was aborted" +
                  abort_note);
    }
    return r.state == ProbeResult::State::ready;
  };
  if (core::poll_until(ready, deadline, policy)) return;
  const std::string abort_note = run_abort(abort);
  const int rank = world_rank();
  std::ostringstream os;
  os << describe() << " did not complete within " << deadline.limit_s() << " s at "
     << core::describe_current_step() << " (rank " << rank
     << " waited; a peer is missing, hung or slower than the deadline); the communicator "
        "was aborted"
     << abort_note << "\nrecent operations on rank " << rank
     << " (flight recorder, oldest first):\n"
     << core::FlightRecorder::instance().report();
  throw TimeoutError(os.str());
}

}  // namespace

void exchange_unique_id(Communicator& group, NcclUniqueIdBytes& id, double timeout_s) {
  const std::string what = group_text(group.name(), group.size());
  core::FlightScope scope("nccl: unique id exchange on group '" + group.name() + "'");
  Request request = group.ibroadcast(id.data(), id.size(), DType::u8, 0);
  try {
    request.wait_for(timeout_s);
  } catch (const TimeoutError& e) {
    // The request stays pending (Request's rules): the job is about to be aborted.
    throw TimeoutError("NCCL unique id exchange on " + what + " failed: " + e.what());
  } catch (const Error& e) {
    throw Error("NCCL unique id exchange on " + what + " failed: " + e.what());
  }
}

void wait_for_init(const Probe& probe, double timeout_s, const std::string& group_name,
                   int group_size, const AbortCallback& abort) {
  const std::string what = "ncclCommInitRankConfig on " + group_text(group_name, group_size);
  core::FlightScope scope("nccl: " + what);
  wait_for_probe(
      probe, timeout_s, [&] { return what; }, abort, core::PollPolicy::startup());
}

void wait_for_collective(const Probe& probe, double timeout_s,
                         const std::function<std::string()>& describe, const AbortCallback& abort) {
  wait_for_probe(probe, timeout_s, describe, abort, core::PollPolicy::collective());
}

std::unique_ptr<Communicator> make_device_communicator(Communicator& mpi_group, std::string name,
                                                       double timeout_s, double init_timeout_s,
                                                       void* compute_stream) {
#if DSTRAIN_HAVE_NCCL
  auto comm = make_nccl_communicator(mpi_group, std::move(name), timeout_s, init_timeout_s);
  static_cast<NcclCommunicator&>(*comm).set_compute_stream(
      static_cast<CUstream_st*>(compute_stream));
  return comm;
#else
  (void)mpi_group;
  (void)timeout_s;
  (void)init_timeout_s;
  (void)compute_stream;
  throw Error("comm: group '" + name +
              "' asks for an NCCL communicator, but this build has none (DSTRAIN_ENABLE_NCCL=OFF)");
#endif
}

}  // namespace dst::comm
