// GoogleTest main for MPI tests: every rank runs every test; only rank 0 prints the
// GoogleTest report, and a failure on any rank fails the test program on every rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "blas/host_blas.hpp"
#include "core/log.hpp"

namespace {
// On ranks other than 0 the default printer is removed; failures are still printed.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_,
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
  }

 private:
  int rank_;
};
}  // namespace

int main(int argc, char** argv) {
  dst::blas::select_host_kernels(argv);  // before MPI: the kernels dstrain itself runs with
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  dst::log::set_rank(rank);
  ::testing::InitGoogleTest(&argc, argv);
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) {
    // Progress chatter is dropped; failures are still printed with the rank.
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  const int local_failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&local_failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (local_failed) std::fprintf(stderr, "[rank %d] had failing tests\n", rank);
  MPI_Finalize();
  return any_failed;
}
