// Allreduce (sum, f32) over the world communicator, 1 KiB .. 16 MiB.
//
//   mpiexec -n 4 comm_allreduce_benchmark [--benchmark_filter=...]
//
// Every rank runs every iteration (a collective needs all ranks), so every rank must take
// the same iteration-count decisions. Google Benchmark decides from the measured time,
// which differs per rank; the benchmark therefore uses manual time set to the slowest
// rank's time of each iteration (one extra 8-byte allreduce, outside the timed region),
// making the decisions identical everywhere. Only rank 0 reports.
//
// Counters follow nccl-tests: algbw = bytes / time; busbw = algbw * 2 (n-1) / n, the
// traffic per link of a ring allreduce, comparable across rank counts.
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "comm/mpi_communicator.hpp"
#include "common/mpi_benchmark.hpp"
#include "core/log.hpp"

namespace {

// Deadline of the benchmark's collectives: generous, this measures and does not judge.
constexpr double kTimeoutS = 120.0;

void BM_allreduce_f32(benchmark::State& state) {
  auto comm = dst::comm::make_mpi_communicator(MPI_COMM_WORLD, "world", kTimeoutS);
  MPI_Comm raw = dst::comm::mpi_comm_of(*comm);
  const auto bytes = static_cast<std::size_t>(state.range(0));
  std::vector<float> buf(bytes / sizeof(float), 1.0f);  // (bytes/4,)
  double total_s = 0.0;
  comm->barrier();
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    comm->allreduce(buf.data(), buf.size(), dst::DType::f32, dst::comm::ReduceOp::sum);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // Same time on every rank -> same iteration decisions (see the file comment).
    MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_MAX, raw);
    state.SetIterationTime(s);
    total_s += s;
  }
  const int n = comm->size();
  const double algbw = total_s > 0 ? static_cast<double>(bytes) * state.iterations() / total_s : 0;
  state.counters["algbw_GBps"] = algbw / 1e9;
  state.counters["busbw_GBps"] = algbw * 2.0 * (n - 1) / n / 1e9;
  state.counters["ranks"] = n;
}
BENCHMARK(BM_allreduce_f32)->RangeMultiplier(4)->Range(1 << 10, 16 << 20)->UseManualTime();

/// Baseline: MPI's own blocking MPI_Allreduce on the same communicator, which progresses
/// inside the call; the gap to BM_allreduce_f32 is the cost of polling with a deadline.
void BM_mpi_allreduce_f32_baseline(benchmark::State& state) {
  auto comm = dst::comm::make_mpi_communicator(MPI_COMM_WORLD, "world", kTimeoutS);
  MPI_Comm raw = dst::comm::mpi_comm_of(*comm);
  const auto bytes = static_cast<std::size_t>(state.range(0));
  std::vector<float> buf(bytes / sizeof(float), 1.0f);  // (bytes/4,)
  comm->barrier();
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(buf.size()), MPI_FLOAT, MPI_SUM, raw);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_MAX, raw);
    state.SetIterationTime(s);
  }
}
BENCHMARK(BM_mpi_allreduce_f32_baseline)
    ->RangeMultiplier(4)
    ->Range(1 << 10, 16 << 20)
    ->UseManualTime();

/// Expert parallelism's token exchange: every rank sends range(0) bytes in all, an equal
/// block to each rank (its own included), with Communicator::ialltoallv polled with the
/// deadline. Bus bandwidth as nccl-tests counts an all-to-all: algbw x (n-1)/n (the block
/// a rank keeps does not cross), to compare with BM_allreduce_f32's on the same ranks.
void BM_alltoallv_f32(benchmark::State& state) {
  auto comm = dst::comm::make_mpi_communicator(MPI_COMM_WORLD, "world", kTimeoutS);
  MPI_Comm raw = dst::comm::mpi_comm_of(*comm);
  const int n = comm->size();
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const std::size_t block = bytes / sizeof(float) / static_cast<std::size_t>(n);
  const std::vector<std::size_t> counts(static_cast<std::size_t>(n), block);
  std::vector<float> send(block * static_cast<std::size_t>(n), 1.0f), recv(send.size());
  double total_s = 0.0;
  comm->barrier();
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    comm->ialltoallv(send.data(), counts, recv.data(), counts, dst::DType::f32).wait();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_MAX, raw);
    state.SetIterationTime(s);
    total_s += s;
  }
  const double moved = static_cast<double>(send.size() * sizeof(float));
  const double algbw = total_s > 0 ? moved * static_cast<double>(state.iterations()) / total_s : 0;
  state.counters["algbw_GBps"] = algbw / 1e9;
  state.counters["busbw_GBps"] = algbw * (n - 1) / n / 1e9;
  state.counters["ranks"] = n;
}
BENCHMARK(BM_alltoallv_f32)->RangeMultiplier(4)->Range(1 << 10, 16 << 20)->UseManualTime();

/// Reports nothing: ranks other than 0 run the benchmarks silently.
}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  dst::log::set_rank(rank);
  if (!dst::bench::initialize_for_rank(rank, argc, argv)) {
    MPI_Finalize();
    return 2;
  }
  const std::size_t ran = dst::bench::run_reporting_on_rank0(rank);
  benchmark::Shutdown();
  MPI_Finalize();
  return ran > 0 ? 0 : 1;  // a filter that matches nothing is a broken smoke test
}
