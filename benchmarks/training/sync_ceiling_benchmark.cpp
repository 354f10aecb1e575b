// The host's ceiling for 1 -> n rank scaling of a synchronous step.
//
//   mpiexec -n 2 training_sync_ceiling_benchmark
//
// A data-parallel step ends when its slowest rank does. On a shared VM each core's speed
// moves by itself from second to second (docs/performance.md: 10-40% on this host's
// cores), so n ranks with the same work finish each step at the pace of whichever core is
// slowest at that moment, even with no communication at all. This benchmark measures that
// loss alone: every rank runs the same fixed work, the dense layer products of a `tiny`
// step through dst::blas::gemm (common/tiny_layers.hpp), and nothing else.
//
// Each iteration times two steps, the order alternating (common/paired.hpp):
//   alone:    rank 0 computes while the other ranks sleep (as a one-rank run, whose other
//             cores are idle), timed on rank 0;
//   together: every rank computes, then all meet in dstrain's own barrier (the wait a
//             training step ends with), timed on rank 0 from the common start to the
//             barrier's end: the slowest rank's work.
// Counter `scaling` is the median over iterations of alone / together: the 1 -> n scaling
// efficiency (tokens/s at n / (n x tokens/s at 1), weak scaling) that a synchronous step
// of this work reaches on this host at this time, without communication or memory
// traffic beyond its own products. `straggle` is the median of the slowest rank's work
// over the fastest's in the together steps. benchmarks/training/ddp_compare.py runs it
// once per repetition beside dstrain's runs and prints dstrain's scaling next to it.
//
// Every rank runs every iteration with the same fixed iteration count (the registrations
// below), so no rank decides on its own to stop; every wait has a deadline.
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "blas/gemm.hpp"
#include "blas/host_blas.hpp"
#include "comm/mpi_communicator.hpp"
#include "common/mpi_benchmark.hpp"
#include "common/paired.hpp"
#include "common/tiny_layers.hpp"
#include "core/error.hpp"
#include "core/log.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using dst::blas::Trans;

// Deadline of every wait: generous, this measures and does not judge.
constexpr double kTimeoutS = 120.0;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// One step's work: forward, input-gradient and weight-gradient products of every dense layer
// of `tiny`, `layers` times, over `tokens` tokens.
class TinyProducts {
 public:
  TinyProducts(std::int64_t tokens, std::int64_t layers) : tokens_(tokens), layers_(layers) {
    std::int64_t widest = 0;
    for (const auto& l : dst::bench::kTinyDenseLayers)
      widest = std::max({widest, l.out, l.in});
    // Values in [0.5, 1.5): no subnormals, no growth towards overflow.
    auto filled = [](std::size_t n, int period) {
      std::vector<float> v(n);
      for (std::size_t i = 0; i < n; ++i)
        v[i] = 0.5F + static_cast<float>(i % period) / static_cast<float>(period);
      return v;
    };
    const auto act = static_cast<std::size_t>(tokens * widest);
    x_ = filled(act, 97);
    dy_ = filled(act, 89);
    y_.assign(act, 0.0F);
    w_ = filled(static_cast<std::size_t>(widest * widest), 83);
    dw_.assign(w_.size(), 0.0F);
  }

  void run() {
    const std::int64_t t = tokens_;
    for (std::int64_t layer = 0; layer < layers_; ++layer)
      for (const auto& l : dst::bench::kTinyDenseLayers) {
        // y (t, out) = x (t, in) W^T;  dx (t, in) = dy (t, out) W;  dW (out, in) += dy^T x
        dst::blas::gemm(host_, Trans::no, Trans::yes, t, l.out, l.in, 1.0F, x_.data(), l.in,
                        w_.data(), l.in, 0.0F, y_.data(), l.out);
        dst::blas::gemm(host_, Trans::no, Trans::no, t, l.in, l.out, 1.0F, dy_.data(), l.out,
                        w_.data(), l.in, 0.0F, y_.data(), l.in);
        dst::blas::gemm(host_, Trans::yes, Trans::no, l.out, l.in, t, 1.0F, dy_.data(), l.out,
                        x_.data(), l.in, 1.0F, dw_.data(), l.in);
      }
    benchmark::DoNotOptimize(y_.data());
    benchmark::DoNotOptimize(dw_.data());
    benchmark::ClobberMemory();
  }

  double flops() const {
    double per_layer = 0;
    for (const auto& l : dst::bench::kTinyDenseLayers)
      per_layer += 3.0 * 2.0 * static_cast<double>(tokens_ * l.out * l.in);
    return per_layer * static_cast<double>(layers_);
  }

 private:
  std::int64_t tokens_, layers_;
  std::vector<float> x_, dy_, y_, w_, dw_;
  dst::tensor::ExecContext host_{};
};

// Waits for `r` without occupying the core: a rank with nothing to do in the alone step
// should leave its core idle, as the idle cores of a one-rank run are.
void sleep_until_done(dst::comm::Request& r, const char* what) {
  const auto t0 = Clock::now();
  while (!r.test()) {
    if (seconds_since(t0) > kTimeoutS)
      throw dst::TimeoutError(std::string("training_sync_ceiling_benchmark: ") + what +
                              " not complete after " + std::to_string(kTimeoutS) + " s");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  r.wait();
}

// Args: tokens per step, times tiny's dense layers are run per step.
void BM_sync_ceiling(benchmark::State& state) {
  auto comm = dst::comm::make_mpi_communicator(MPI_COMM_WORLD, "world", kTimeoutS);
  const int rank = comm->rank();
  TinyProducts work(state.range(0), state.range(1));
  work.run();  // first touch of the buffers and the BLAS's own set-up, untimed
  // Rank 0's time for its work alone; the others sleep until it is done.
  auto alone = [&] {
    // Rank 0 enters the barrier only after its work: a barrier completes once every rank
    // has entered it, so the others sleep until rank 0 is done and do not start the next
    // step beside its work.
    if (rank != 0) {
      auto done = comm->ibarrier();
      sleep_until_done(done, "the alone step's barrier");
      return 0.0;
    }
    const auto t0 = Clock::now();
    work.run();
    const double s = seconds_since(t0);
    comm->barrier();
    return s;
  };
  // From a common start to the end of the barrier every rank enters after its work: the
  // slowest rank's work. Also returns the slowest and fastest rank's own work.
  auto together = [&](double& slowest, double& fastest) {
    comm->barrier();
    const auto t0 = Clock::now();
    work.run();
    double mine[2] = {seconds_since(t0), 0.0};
    comm->barrier();
    const double s = seconds_since(t0);
    mine[1] = -mine[0];
    comm->allreduce(mine, 2, dst::DType::f64, dst::comm::ReduceOp::max);
    slowest = mine[0];
    fastest = -mine[1];
    return s;
  };
  dst::bench::PairedTimes t;  // baseline: alone, candidate: together
  std::vector<double> straggle;
  bool together_first = false;
  for (auto _ : state) {
    double slowest = 0.0, fastest = 0.0, a = 0.0, b = 0.0;
    if (together_first) {
      b = together(slowest, fastest);
      a = alone();
    } else {
      a = alone();
      b = together(slowest, fastest);
    }
    together_first = !together_first;
    // Rank 0's figures on every rank, so that every rank reports the same.
    double ab[2] = {a, b};
    comm->broadcast(ab, 2, dst::DType::f64, 0);
    t.baseline.push_back(ab[0]);
    t.candidate.push_back(ab[1]);
    straggle.push_back(fastest > 0 ? slowest / fastest : 1.0);
    state.SetIterationTime(ab[1]);
  }
  state.counters["scaling"] = t.median_ratio();
  state.counters["straggle"] = dst::bench::median_of(straggle);
  state.counters["alone_ms"] = 1e3 * dst::bench::median_of(t.baseline);
  state.counters["together_ms"] = 1e3 * dst::bench::median_of(t.candidate);
  state.counters["ranks"] = comm->size();
  const double alone_s = dst::bench::median_of(t.baseline);
  state.counters["GFLOPS_alone"] = alone_s > 0 ? 1e-9 * work.flops() / alone_s : 0.0;
}

}  // namespace

int main(int argc, char** argv) {
  dst::blas::select_host_kernels(argv);  // before MPI: it may start the program again
  openblas_set_num_threads(1);           // one core per rank, as dstrain runs
  MPI_Init(&argc, &argv);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  dst::log::set_rank(rank);
  // A step of `tiny` (2048 tokens, its four layers' products, about 0.3 s here) and a short
  // one for the CTest smoke run. Fixed iteration counts: every rank runs every iteration.
  benchmark::RegisterBenchmark("BM_sync_ceiling", BM_sync_ceiling)
      ->ArgNames({"tokens", "layers"})
      ->Args({dst::bench::kTinyTokens, 4})
      ->Iterations(20)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("BM_sync_ceiling", BM_sync_ceiling)
      ->ArgNames({"tokens", "layers"})
      ->Args({64, 1})
      ->Iterations(4)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  if (!dst::bench::initialize_for_rank(rank, argc, argv)) {
    MPI_Finalize();
    return 2;
  }
  int status = 0;
  try {
    status = dst::bench::run_reporting_on_rank0(rank) > 0 ? 0 : 1;
  } catch (const dst::Error& e) {
    dst::log::error(e.what());
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  benchmark::Shutdown();
  MPI_Finalize();
  return status;
}
