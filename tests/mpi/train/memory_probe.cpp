// `dstrain check`'s memory plan against a measured training step, per rank: the Trainer
// (model, gradients, AdamW, gradient buckets or the shared-memory buffers) built and two
// optimizer steps run on every rank of the launch, and each rank's memory compared with
// the plan's total for that layout (train::make_plan). Exits non-zero if any rank is off
// by more than 10%.
//
// Measured per rank = the proportional set size (Pss, /proc/self/smaps_rollup) after the
// steps minus before the Trainer, plus the transient peak above it (VmHWM - VmRSS, when
// the high-water mark rose during the steps). Pss, not the resident set: the shared-memory
// gradient and parameter buffers (parallel.backend shm) are one window that every rank
// touches a part of, and Pss counts each shared page once over the ranks that map it, as
// the plan does. OpenBLAS's own buffers are made by a warm-up product before the baseline,
// since they are not the run's.
// usage: memory_probe PRESET MICRO_BATCH RECOMPUTE BACKEND [ZERO_STAGE [EXPERT [TENSOR
//        [SEQUENCE_PARALLEL [PIPELINE [CHUNKS]]]]]]
//        (BACKEND: mpi | shm; ZERO_STAGE: parallel.zero_stage, 0 when absent; PIPELINE:
//        stages, each rank against its own stage's plan, 4 micro-batches per step; CHUNKS:
//        parallel.virtual_stages, the interleaved schedule when > 1)
#include <mpi.h>
#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "blas/gemm.hpp"
#include "blas/host_blas.hpp"
#include "comm/process_groups.hpp"
#include "config/deck.hpp"
#include "core/log.hpp"
#include "train/plan.hpp"
#include "train/trainer.hpp"

namespace {

/// `key` of /proc/self/<file> in KiB (-1 if absent).
long proc_kib(const char* file, const char* key) {
  std::ifstream in(std::string("/proc/self/") + file);
  std::string k, unit;
  long v = 0;
  while (in >> k) {
    if (k == key) {
      in >> v >> unit;
      return v;
    }
    std::getline(in, unit);
  }
  return -1;
}

struct Sample {
  long pss, rss, hwm;  // KiB
  static Sample now() {
    return {proc_kib("smaps_rollup", "Pss:"), proc_kib("status", "VmRSS:"),
            proc_kib("status", "VmHWM:")};
  }
};

/// Sample i: tokens from a fixed formula over the vocabulary.
class FormulaStore final : public dst::data::SampleStore {
 public:
  FormulaStore(std::int64_t seq_len, std::int64_t vocab) : T_(seq_len), V_(vocab) {}
  std::uint64_t num_samples() const override { return 256; }
  void read(const std::vector<std::uint64_t>& ids, std::int32_t* out) override {
    for (std::size_t i = 0; i < ids.size(); ++i)
      for (std::int64_t t = 0; t <= T_; ++t)
        out[i * static_cast<std::size_t>(T_ + 1) + static_cast<std::size_t>(t)] =
            static_cast<std::int32_t>((ids[i] * 7919 + static_cast<std::uint64_t>(t) * 104729) %
                                      static_cast<std::uint64_t>(V_));
  }

 private:
  std::int64_t T_, V_;
};

int probe(int argc, char** argv, int rank, int world) {
  if (argc < 5 || argc > 11) {
    if (rank == 0)
      std::fprintf(stderr,
                   "usage: memory_probe PRESET MICRO_BATCH RECOMPUTE mpi|shm [ZERO [EXPERT "
                   "[TENSOR [SEQUENCE_PARALLEL 0|1 [PIPELINE [CHUNKS]]]]]]\n");
    return 2;
  }
  const std::string preset = argv[1], micro = argv[2], recompute = argv[3], backend = argv[4];
  const std::string zero = argc >= 6 ? argv[5] : "0";
  const std::string expert = argc >= 7 ? argv[6] : "1";
  const std::string tensor = argc >= 8 ? argv[7] : "1";
  const bool sequence = argc >= 9 && std::string(argv[8]) == "1";
  const int pipeline = argc >= 10 ? std::stoi(argv[9]) : 1;
  const int chunks = argc >= 11 ? std::stoi(argv[10]) : 1;
  // With stages, 4 micro-batches a step (a multiple of the stages, as interleaved needs).
  const int accumulation = pipeline > 1 ? 4 : 1;
  const auto cfg = dst::config::load_deck_text(
      "model: {preset: " + preset + "}\ntraining: {micro_batch_size: " + micro +
          ", global_batch_size: " +
          std::to_string(std::stoi(micro) * world / std::stoi(tensor) / pipeline * accumulation) +
          ", max_steps: 2, recompute: " + recompute + "}\nparallel: {backend: " + backend +
          ", zero_stage: " + zero + ", expert: " + expert + ", tensor: " + tensor +
          ", sequence_parallel: " + (sequence ? "true" : "false") +
          ", pipeline: " + std::to_string(pipeline) +
          ", pipeline_schedule: " + (chunks > 1 ? "interleaved" : "1f1b") +
          ", virtual_stages: " + std::to_string(chunks) + "}\ndebug: {consistency_every: 0}\n",
      "memory_probe");
  const dst::config::Layout layout = dst::config::resolve_layout(cfg, world);
  dst::comm::ProcessGroups groups = dst::comm::make_process_groups(MPI_COMM_WORLD, layout, 120.0);
  FormulaStore store(cfg.data.seq_len, cfg.model.vocab_size);
  {  // warm-up: OpenBLAS allocates its work buffers on first use
    std::vector<float> a(512 * 512, 1.0f), c(a.size());
    dst::blas::gemm({}, dst::blas::Trans::no, dst::blas::Trans::no, 512, 512, 512, 1.0f, a.data(),
                    512, a.data(), 512, 0.0f, c.data(), 512);
  }
  dst::train::Trainer::Options options;
  const bool shm = backend == "shm" && world > 1;  // one rank alone has nothing to share
  options.grad_comm = shm ? dst::runtime::CommBackend::shm : dst::runtime::CommBackend::mpi;
  dst::train::PlanOptions plan_options;
  plan_options.bucket_copies = !shm;
  plan_options.zero_stage = cfg.parallel.zero_stage;
  plan_options.rank = groups.data->rank();  // each rank against its own plan
  const dst::train::Plan plan = dst::train::make_plan(cfg, layout, plan_options);

  MPI_Barrier(MPI_COMM_WORLD);
  const Sample base = Sample::now();
  Sample after{};
  {
    dst::train::Trainer trainer(cfg, layout, groups, store, options);
    trainer.initialize_parameters();
    trainer.step();
    trainer.step();
    MPI_Barrier(MPI_COMM_WORLD);  // every rank's part of the shared buffers is touched
    after = Sample::now();
  }
  const long transient = after.hwm > base.hwm ? after.hwm - std::max(base.hwm, after.rss) : 0;
  const double measured_mib =
      static_cast<double>(after.pss - base.pss + std::max(0L, transient)) / 1024.0;
  // Stages: each rank against its own stage's plan (plan.memory is the heaviest one's).
  const double plan_mib =
      static_cast<double>(
          pipeline > 1
              ? plan.stages.at(static_cast<std::size_t>(groups.pipeline_rank)).memory.total()
              : plan.memory.total()) /
      1048576.0;
  const double ratio = measured_mib / plan_mib;

  std::vector<double> ratios(static_cast<std::size_t>(world)), mibs(ratios.size());
  MPI_Gather(&ratio, 1, MPI_DOUBLE, ratios.data(), 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  MPI_Gather(&measured_mib, 1, MPI_DOUBLE, mibs.data(), 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  int ok = 1;
  if (rank == 0) {
    const auto [lo, hi] = std::minmax_element(ratios.begin(), ratios.end());
    const auto [mlo, mhi] = std::minmax_element(mibs.begin(), mibs.end());
    ok = *lo > 0.9 && *hi < 1.1;
    std::printf(
        "memory_probe %s micro-batch %s recompute %s zero %d%s%s%s%s np%d %s: planned %.1f MiB on "
        "rank "
        "0 "
        "(activations %.1f, recomputed %.1f), measured %.1f .. %.1f MiB (ratio %.3f .. %.3f)%s\n",
        preset.c_str(), micro.c_str(), recompute.c_str(), static_cast<int>(cfg.parallel.zero_stage),
        expert == "1" ? "" : (" expert " + expert).c_str(),
        tensor == "1" ? "" : (" tensor " + tensor).c_str(), sequence ? " sequence-parallel" : "",
        pipeline == 1 ? ""
                      : (" pipeline " + std::to_string(pipeline) +
                         (chunks > 1 ? " interleaved " + std::to_string(chunks) : std::string()))
                            .c_str(),
        world, shm ? "shm" : "mpi", plan_mib,
        static_cast<double>(plan.memory.activations) / 1048576.0,
        static_cast<double>(plan.memory.recompute) / 1048576.0, *mlo, *mhi, *lo, *hi,
        ok ? "" : " OUTSIDE 10%");
    std::printf("memory_probe: measured / planned MiB by rank:");
    for (std::size_t r = 0; r < mibs.size(); ++r)
      std::printf(" %.1f / %.1f", mibs[r], mibs[r] / ratios[r]);
    std::printf("\n");
  }
  MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  dst::blas::select_host_kernels(argv);  // before MPI: the kernels dstrain itself runs with
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  dst::log::set_rank(rank);
  int rc = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    rc = probe(argc, argv, rank, world);
  }
  MPI_Finalize();
  return rc;
}
