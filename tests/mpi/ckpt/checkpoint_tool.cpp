// Helper of the checkpoint tests that need a process of their own:
//
//   checkpoint_tool write DIR      saves DIR/step-7.h5 from the formulas below (the
//                                  oracle, tests/oracle/check_checkpoint.py, re-derives
//                                  every value with h5py + xxhash)
//   checkpoint_tool crash DIR R    empties DIR, commits step 1, then saves step 2 with
//                                  SaveFaults{exit_rank = R}: rank R _exits with
//                                  kExitInjected halfway, leaving step-2.h5.tmp
//   checkpoint_tool recover DIR    after a crash: clean_leftovers() removes the .tmp,
//                                  `latest` still names step 1, which verifies
//
// Tensor k (in the order of kTensors) element i is
//   ((i * 2654435761 + k * 97) mod 1000003) / 1000003 - 0.5, computed in double, stored f32.
#include <mpi.h>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include "ckpt/checkpoint.hpp"
#include "core/exit_codes.hpp"
#include "core/log.hpp"

namespace {

using namespace dst::ckpt;

struct Spec {
  const char* name;
  std::vector<std::int64_t> shape;
};
const std::vector<Spec> kTensors = {
    {"params/model.embed_tokens.weight", {260, 48}},
    {"params/model.layers.0.self_attn.q_proj.weight", {48, 48}},
    {"params/model.layers.0.mlp.up_proj.weight", {520, 700}},  // 1.4 MiB: 2 blocks
    {"params/model.norm.weight", {48}},
    {"params/model.step_scalar", {}},
    {"params/model.empty", {0, 4}},
    {"optimizer/exp_avg/model.layers.0.mlp.up_proj.weight", {520, 700}},
    {"optimizer/exp_avg_sq/model.norm.weight", {48}},
};

std::vector<std::vector<float>> make_data() {
  std::vector<std::vector<float>> out;
  for (std::size_t k = 0; k < kTensors.size(); ++k) {
    std::uint64_t n = 1;
    for (auto d : kTensors[k].shape)
      n *= static_cast<std::uint64_t>(d);
    std::vector<float> t(n);
    for (std::uint64_t i = 0; i < n; ++i)
      t[i] = static_cast<float>(
          static_cast<double>((i * 2654435761ull + k * 97) % 1000003) / 1000003.0 - 0.5);
    out.push_back(std::move(t));
  }
  return out;
}

Metadata make_meta(std::int64_t step, int size) {
  Metadata m;
  m.step = step;
  m.epoch = 3;
  m.consumed = 1000;
  m.samples_seen = 98765;
  m.optimizer_steps = step;
  m.skipped_steps = 0;
  m.seed = 1234;
  m.rng = "philox seed 1234";
  m.loss_scale = 1.0;
  m.loss_scale_clean_steps = 0;
  m.deck_yaml = "run:\n  seed: 1234\nmodel:\n  preset: tiny\ntraining:\n  max_steps: 7\n";
  m.software_version = "dstrain oracle-writer";
  m.world_size = size;
  m.data_parallel = size;
  m.global_batch_size = 8;
  m.micro_batch_size = 2;
  m.grad_accum_steps = 4 / size > 0 ? 4 / size : 1;
  return m;
}

IoStats save(Directory& dir, std::int64_t step, int size, SaveFaults faults = {}) {
  const auto data = make_data();
  std::vector<TensorRef> refs;
  for (std::size_t k = 0; k < kTensors.size(); ++k)
    refs.push_back({kTensors[k].name, kTensors[k].shape, data[k].data()});
  return dir.save(make_meta(step, size), refs, 0, faults);
}

int run(int argc, char** argv, int rank, int size) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (argc < 3) {
    std::fprintf(stderr, "usage: checkpoint_tool write|crash|recover DIR [RANK]\n");
    return dst::kExitUsage;
  }
  Directory dir(MPI_COMM_WORLD, argv[2], 60);
  if (cmd == "write") {
    dir.clean_leftovers();
    const IoStats s = save(dir, 7, size);
    if (rank == 0)
      std::printf("wrote %s: %llu bytes by %d ranks, collective %d\n", s.path.c_str(),
                  static_cast<unsigned long long>(s.bytes), size, s.collective ? 1 : 0);
    return 0;
  }
  if (cmd == "crash" && argc > 3) {
    if (rank == 0) std::filesystem::remove_all(argv[2]);
    MPI_Barrier(MPI_COMM_WORLD);
    dir.clean_leftovers();
    save(dir, 1, size);
    save(dir, 2, size, SaveFaults{std::stoi(argv[3])});
    if (rank == 0) std::printf("error: the injected exit did not happen\n");
    return dst::kExitError;
  }
  if (cmd == "recover") {
    const int removed = dir.clean_leftovers();
    const std::string latest = dir.latest();
    Reader r(MPI_COMM_WORLD, latest, 60);
    const auto bad = r.verify_all();
    if (rank == 0)
      std::printf("recovered: removed %d leftover(s); latest %s, step %lld, %zu tensors, %zu bad\n",
                  removed, latest.c_str(), static_cast<long long>(r.metadata().step),
                  r.tensors().size(), bad.size());
    return bad.empty() ? 0 : dst::kExitCheckpoint;
  }
  std::fprintf(stderr, "checkpoint_tool: unknown command %s\n", cmd.c_str());
  return dst::kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  dst::log::set_rank(rank);
  int rc = 0;
  try {
    rc = run(argc, argv, rank, size);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] error: %s\n", rank, e.what());
    rc = dst::kExitCheckpoint;
  }
  MPI_Finalize();
  return rc;
}
