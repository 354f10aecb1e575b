// Token dataset reading under MPI: read throughput per rank, and the prefetch
// hidden-latency experiment.
//
//   mpiexec -n 4 dataset_benchmark [--benchmark_filter=...]
//
// Rank 0 writes a dataset once (4 shards x 2^21 byte-level tokens, uint16, 8 MiB per
// rank-count-independent run) in a temporary folder; every rank opens it and reads its own
// block of each step's global batch, as training does (Sampler, seed 1).
//
// BM_read_throughput/B: one rank reads B samples of T = 1024 (+1) tokens per iteration,
//   without prefetching, so the time is the read itself. Counters per rank:
//   tokens_per_s, MBps (of int32 delivered), reads_per_sample.
// BM_prefetch_hidden_latency/delay_ms/compute_ms/prefetch: a training loop in which each
//   step waits for its batch, requests the next and "computes" (sleeps compute_ms). Every
//   read is slowed by delay_ms (debug.inject_read_delay_ms). With prefetching and
//   delay < compute, the read hides behind the compute and step_ms ~ compute_ms; with
//   delay > compute, step_ms ~ delay_ms; without prefetching step_ms ~ delay + compute.
//   The fake compute sleeps rather than spins: 4 ranks share 2 cores here, and a spinning
//   "compute" would measure CPU contention with the reader thread, not hidden latency.
//
// Iteration counts are fixed so that every rank runs the same number of iterations (the
// reads are independent, but the per-iteration time reported is the slowest rank's,
// taken with one MPI_Allreduce outside the timed region).
#include <benchmark/benchmark.h>
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <thread>
#include <vector>

#include "common/mpi_benchmark.hpp"
#include "core/log.hpp"
#include "data/byte_vocab.hpp"
#include "data/dataset/batch_reader.hpp"
#include "data/dataset/sampler.hpp"
#include "data/dataset/shard_writer.hpp"
#include "data/dataset/token_dataset.hpp"

namespace {

using dst::data::BatchReader;
using dst::data::BatchReaderOptions;
using dst::data::Sampler;
using dst::data::SamplerConfig;
using dst::data::TokenDataset;

constexpr int kSeqLen = 1024;
constexpr int kShards = 4;
constexpr std::uint64_t kTokensPerShard = std::uint64_t{1} << 21;

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// The folder of the benchmark dataset (written once by rank 0, removed at exit).
std::string g_dir;

void write_dataset() {
  std::string dir;
  if (world_rank() == 0) {
    dir = (std::filesystem::temp_directory_path() /
           ("dst_dataset_bench_" + std::to_string(::getpid())))
              .string();
    std::filesystem::create_directories(dir);
    dst::data::ShardWriterOptions o;
    o.vocab_size = dst::data::kByteVocabSize;
    o.eos_id = dst::data::kByteEos;
    o.tokenizer = {"byte260", dst::data::definition_hash("byte260")};
    std::vector<std::int32_t> doc(4000);  // documents of 4000 bytes + EOS
    for (int s = 0; s < kShards; ++s) {
      dst::data::ShardWriter w(dir + "/shard-" + std::to_string(s) + ".h5", o);
      for (std::uint64_t n = 0; n + doc.size() + 1 <= kTokensPerShard; n += doc.size() + 1) {
        for (std::size_t j = 0; j < doc.size(); ++j)
          doc[j] = static_cast<std::int32_t>((n + j * 7 + s) % 256);
        w.append_document(doc);
      }
      w.close();
    }
  }
  unsigned long len = dir.size();
  MPI_Bcast(&len, 1, MPI_UNSIGNED_LONG, 0, MPI_COMM_WORLD);
  dir.resize(len);
  MPI_Bcast(dir.data(), static_cast<int>(len), MPI_CHAR, 0, MPI_COMM_WORLD);
  g_dir = dir;
}

Sampler make_sampler(const TokenDataset& ds, std::uint64_t per_rank) {
  SamplerConfig c;
  c.num_samples = ds.num_samples();
  c.seed = 1;
  c.global_batch_size = per_rank * static_cast<std::uint64_t>(world_size());
  c.micro_batch_size = per_rank;
  c.dp_rank = world_rank();
  c.dp_size = world_size();
  return Sampler(c);
}

double slowest(double s) {
  MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return s;
}

void BM_read_throughput(benchmark::State& state) {
  const TokenDataset ds = dst::data::open_dataset(MPI_COMM_WORLD, g_dir, kSeqLen);
  const auto batch = static_cast<std::uint64_t>(state.range(0));
  Sampler sampler = make_sampler(ds, batch);
  BatchReaderOptions opt;
  opt.prefetch = false;
  BatchReader reader(ds, opt);
  double total_s = 0;
  MPI_Barrier(MPI_COMM_WORLD);
  for (auto _ : state) {
    const auto ids = sampler.next_step().front();  // (B,)
    const auto t0 = std::chrono::steady_clock::now();
    reader.request(ids);
    const auto b = reader.wait();  // (B, T+1)
    benchmark::DoNotOptimize(b.tokens.data());
    const double s =
        slowest(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    state.SetIterationTime(s);
    total_s += s;
  }
  const double tokens = static_cast<double>(state.iterations()) * batch * (kSeqLen + 1);
  state.counters["tokens_per_s"] = tokens / total_s;
  state.counters["MBps"] = tokens * 4 / total_s / 1e6;
  state.counters["reads_per_sample"] =
      static_cast<double>(reader.stats().reads) / (static_cast<double>(state.iterations()) * batch);
  state.counters["ranks"] = world_size();
}
BENCHMARK(BM_read_throughput)->Arg(1)->Arg(8)->Arg(32)->Iterations(50)->UseManualTime();

void BM_prefetch_hidden_latency(benchmark::State& state) {
  const TokenDataset ds = dst::data::open_dataset(MPI_COMM_WORLD, g_dir, kSeqLen);
  const auto delay_ms = static_cast<int>(state.range(0));
  const auto compute = std::chrono::milliseconds(state.range(1));
  Sampler sampler = make_sampler(ds, 8);
  BatchReaderOptions opt;
  opt.prefetch = state.range(2) != 0;
  opt.inject_read_delay_ms = delay_ms;
  BatchReader reader(ds, opt);
  reader.request(sampler.next_step().front());
  // Let the first request complete so the loop starts in the steady state.
  std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms + 5));
  double total_s = 0, wait_s = 0;
  MPI_Barrier(MPI_COMM_WORLD);
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto b = reader.wait();  // this step's batch (8, T+1)
    const auto t1 = std::chrono::steady_clock::now();
    reader.request(sampler.next_step().front());  // the next step's, read meanwhile
    benchmark::DoNotOptimize(b.tokens.data());
    std::this_thread::sleep_for(compute);  // the fake forward/backward
    const double s =
        slowest(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    state.SetIterationTime(s);
    total_s += s;
    wait_s += std::chrono::duration<double>(t1 - t0).count();
  }
  reader.wait();  // the request made by the last iteration
  state.counters["step_ms"] = 1e3 * total_s / static_cast<double>(state.iterations());
  state.counters["wait_ms"] = 1e3 * wait_s / static_cast<double>(state.iterations());
  state.counters["compute_ms"] = static_cast<double>(state.range(1));
  state.counters["delay_ms"] = delay_ms;
}
BENCHMARK(BM_prefetch_hidden_latency)
    ->ArgNames({"delay_ms", "compute_ms", "prefetch"})
    ->Args({0, 20, 1})
    ->Args({10, 20, 1})
    ->Args({30, 20, 1})
    ->Args({10, 20, 0})
    ->Args({2, 5, 1})  // the smoke test's: short
    ->Iterations(20)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

/// Reports nothing: ranks other than 0 run the benchmarks silently.
}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  // The prefetch thread reads with MPI-IO while the main thread runs MPI_Allreduce.
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  const int rank = world_rank();
  dst::log::set_rank(rank);
  if (!dst::bench::initialize_for_rank(rank, argc, argv)) {
    MPI_Finalize();
    return 2;
  }
  std::size_t ran = 0;
  try {
    write_dataset();
    ran = dst::bench::run_reporting_on_rank0(rank);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] error: %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  benchmark::Shutdown();
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) std::filesystem::remove_all(g_dir);
  MPI_Finalize();
  return ran > 0 ? 0 : 1;  // a filter that matches nothing is a broken smoke test
}
