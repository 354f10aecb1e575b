#pragma once
// Google Benchmark inside an MPI job: every rank runs every benchmark (the collectives
// need all of them), only rank 0 reports, and only rank 0 may write --benchmark_out.
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

namespace dst::bench {

/// A reporter that prints nothing, for ranks other than 0.
class NullReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

/// benchmark::Initialize for this rank (others drop --benchmark_out*). False when an
/// argument is not recognised (Google Benchmark has printed which).
inline bool initialize_for_rank(int rank, int argc, char** argv) {
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i)
    if (rank == 0 || std::strncmp(argv[i], "--benchmark_out", 15) != 0) args.push_back(argv[i]);
  int nargs = static_cast<int>(args.size());
  args.push_back(nullptr);
  benchmark::Initialize(&nargs, args.data());
  return !benchmark::ReportUnrecognizedArguments(nargs, args.data());
}

/// Runs the selected benchmarks on this rank, reporting on rank 0 only; the number run.
inline std::size_t run_reporting_on_rank0(int rank) {
  NullReporter quiet;
  return rank == 0 ? benchmark::RunSpecifiedBenchmarks()
                   : benchmark::RunSpecifiedBenchmarks(&quiet);
}

}  // namespace dst::bench
