#include "runtime/mpi_wait.hpp"

#include <sstream>

#include "core/deadline.hpp"
#include "core/error.hpp"
#include "core/flight_recorder.hpp"
#include "core/poll_policy.hpp"
#include "core/step_context.hpp"
#include "runtime/mpi_check.hpp"

namespace dst::runtime {

bool test_request(MPI_Request& request) {
  int done = 0;
  DST_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
  return done != 0;
}

void wait_with_deadline(MPI_Request& request, double timeout_s,
                        const std::function<std::string()>& describe) {
  const core::Deadline deadline(timeout_s);
  if (core::poll_until([&] { return test_request(request); }, deadline,
                       core::PollPolicy::collective()))
    return;
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::ostringstream os;
  os << describe() << " did not complete within " << deadline.limit_s() << " s at "
     << core::describe_current_step() << " (rank " << rank
     << " waited; a peer is missing, hung or slower than the deadline)\n"
     << "recent operations on rank " << rank << " (flight recorder, oldest first):\n"
     << core::FlightRecorder::instance().report();
  throw TimeoutError(os.str());
}

}  // namespace dst::runtime
