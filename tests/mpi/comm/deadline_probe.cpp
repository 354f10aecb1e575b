// comm_deadline_probe: a tiny MPI program for the end-to-end deadline tests.
//   --mode hang   the last rank stays alive but never joins; the others' world allreduce
//                 (3 s deadline) must time out and abort the job.
//   --mode throw  rank 1 fails before the collective; its abort must end the job while
//                 the others still wait (60 s deadline).
//   --mode result rank 0, the root of a runtime::MpiCollectives::broadcast_result (rank 0's
//                 work for every rank), stays alive but never sends; the others' 3 s
//                 deadline must end the job.
// Errors end the job the way the application does: "[rank R] error: ..." on stderr, then
// MPI_Abort with the documented exit code.
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "comm/mpi_communicator.hpp"
#include "core/error.hpp"
#include "core/exit_codes.hpp"
#include "core/log.hpp"
#include "runtime/mpi_collectives.hpp"

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  dst::log::set_rank(rank);
  try {
    std::string mode;
    for (int i = 1; i + 1 < argc; ++i)
      if (std::strcmp(argv[i], "--mode") == 0) mode = argv[i + 1];
    if (mode != "hang" && mode != "throw" && mode != "result")
      throw dst::UsageError("usage: comm_deadline_probe --mode hang|throw|result");
    if (size < 2) throw dst::UsageError("comm_deadline_probe needs at least 2 ranks");

    const double timeout_s = mode == "throw" ? 60.0 : 3.0;
    auto world = dst::comm::make_mpi_communicator(MPI_COMM_WORLD, "world", timeout_s);
    if (mode == "hang" && rank == size - 1) {
      // Alive but absent: only the others' deadline can end the job.
      std::this_thread::sleep_for(std::chrono::seconds(120));
    } else if (mode == "result") {
      dst::runtime::MpiCollectives coll(MPI_COMM_WORLD, timeout_s,
                                        [](const std::string& op) { return "probe: " + op; });
      if (rank == 0) std::this_thread::sleep_for(std::chrono::seconds(120));  // absent root
      coll.broadcast_result({}, 0, "file broadcast");
    } else if (mode == "throw" && rank == 1) {
      throw dst::Error("injected failure on rank 1");
    } else {
      std::vector<float> buf(1024, 1.0f);
      world->allreduce(buf.data(), buf.size(), dst::DType::f32, dst::comm::ReduceOp::sum);
    }
    std::fprintf(stderr, "[rank %d] collective completed unexpectedly\n", rank);
  } catch (const dst::Error& e) {
    std::fprintf(stderr, "[rank %d] error: %s\n", rank, e.what());
    std::fflush(stderr);
    const bool timeout = dynamic_cast<const dst::TimeoutError*>(&e) != nullptr;
    MPI_Abort(MPI_COMM_WORLD, timeout ? dst::kExitTimeout : dst::kExitError);
  }
  MPI_Finalize();
  return 0;
}
