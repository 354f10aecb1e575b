// runtime_root_result_probe: the deadline of MpiCollectives::broadcast_result end to end.
// Rank 0, the root, stays alive but never sends its result; the others' 3 s deadline
// must end the job with a TimeoutError naming the broadcast and the waiting rank.
// Errors end the job the way the application does: "[rank R] error: ..." on stderr, then
// MPI_Abort with the documented exit code.
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "core/error.hpp"
#include "core/exit_codes.hpp"
#include "runtime/mpi_collectives.hpp"

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  try {
    if (size < 2) throw dst::UsageError("runtime_root_result_probe needs at least 2 ranks");
    dst::runtime::MpiCollectives coll(MPI_COMM_WORLD, 3.0,
                                      [](const std::string& op) { return "probe: " + op; });
    if (rank == 0) {
      // Alive but absent: only the others' deadline can end the job.
      std::this_thread::sleep_for(std::chrono::seconds(120));
    } else {
      coll.broadcast_result({}, 0, "file broadcast");
    }
    std::fprintf(stderr, "[rank %d] broadcast completed unexpectedly\n", rank);
  } catch (const dst::Error& e) {
    std::fprintf(stderr, "[rank %d] error: %s\n", rank, e.what());
    std::fflush(stderr);
    const bool timeout = dynamic_cast<const dst::TimeoutError*>(&e) != nullptr;
    MPI_Abort(MPI_COMM_WORLD, timeout ? dst::kExitTimeout : dst::kExitError);
  }
  MPI_Finalize();
  return 0;
}
