#include "runtime/runtime.hpp"

#include <hdf5.h>
#include <unistd.h>
#include <Kokkos_Core.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "core/exit_codes.hpp"
#include "core/log.hpp"
#include "core/parallel.hpp"
#include "core/version.hpp"
#include "runtime/cpu_binding.hpp"
#include "runtime/device.hpp"
#include "runtime/mpi_check.hpp"
#include "runtime/mpi_collectives.hpp"

namespace dst::runtime {

namespace {

std::string host_name() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  return buf;
}

/// Start-up's collectives, named "start-up: <what>" in timeout messages.
MpiCollectives startup_collectives(MPI_Comm comm, double timeout_s) {
  return MpiCollectives(comm, timeout_s,
                        [](const std::string& what) { return "start-up: " + what; });
}

/// On the node's first rank: the warning of describe_crowding() when the node's ranks,
/// together with the machine's other dstrain processes, are confined to fewer CPUs than
/// they are; empty otherwise and on the other ranks. Each rank sends (world rank, pid,
/// its CPUs) to the node's first rank.
std::string cpu_crowding(MPI_Comm local, int world_rank, const std::string& host,
                         double timeout_s) {
  int local_rank = 0;
  int local_size = 1;
  DST_MPI_CHECK(MPI_Comm_rank(local, &local_rank));
  DST_MPI_CHECK(MPI_Comm_size(local, &local_size));
  std::vector<int> mine{world_rank, static_cast<int>(getpid())};
  for (const int c : core::affinity_cpus())
    mine.push_back(c);
  int length = static_cast<int>(mine.size());
  std::vector<int> lengths(static_cast<std::size_t>(local_size));
  MpiCollectives coll = startup_collectives(local, timeout_s);
  coll.gather(&length, 1, MPI_INT, lengths.data(), 0, "CPU masks (sizes)");
  std::vector<int> offsets(lengths.size(), 0);
  for (std::size_t r = 1; r < lengths.size(); ++r)
    offsets[r] = offsets[r - 1] + lengths[r - 1];
  std::vector<int> all(local_rank == 0 ? static_cast<std::size_t>(offsets.back() + lengths.back())
                                       : 0);
  coll.gatherv(mine.data(), length, MPI_INT, all.data(), lengths.data(), offsets.data(), 0,
               "CPU masks");
  if (local_rank != 0) return {};
  std::vector<CpuClaim> claims;
  std::vector<int> pids;
  for (std::size_t r = 0; r < lengths.size(); ++r) {
    const int* p = all.data() + offsets[r];
    claims.push_back({p[0], p[1], CpuList(p + 2, p + lengths[r])});
    pids.push_back(p[1]);
  }
  for (auto& other : other_dstrain_processes(pids))
    claims.push_back(std::move(other));
  const auto crowded = find_crowding(claims);
  return crowded ? describe_crowding(*crowded, host) : std::string();
}

}  // namespace

Runtime::Runtime(int& argc, char**& argv, double init_timeout_s)
    : watchdog_(std::make_unique<StartupWatchdog>()), init_timeout_s_(init_timeout_s) {
  {
    StartupStep step(*watchdog_, "MPI_Init_thread", init_timeout_s_);
    // MULTIPLE lets monitor threads (watchdog, prefetching reader) coexist with the
    // training loop's MPI calls; FUNNELED is the least we can work with.
    const int rc = MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &thread_level_);
    if (rc != MPI_SUCCESS)
      throw Error("start-up: MPI_Init_thread failed (code " + std::to_string(rc) + ")");
    DST_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    DST_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &node_.world_rank));
    DST_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &node_.world_size));
    log::set_rank(node_.world_rank);
    if (thread_level_ < MPI_THREAD_FUNNELED)
      throw Error("start-up: the MPI library provides thread level " + thread_level() +
                  ", dstrain needs at least MPI_THREAD_FUNNELED");
  }
  maybe_stall_for_test(node_.world_rank, "node-local rank");
  MPI_Comm local = MPI_COMM_NULL;  // the ranks of this node
  {
    StartupStep step(*watchdog_, "node-local rank (MPI_Comm_split_type)", init_timeout_s_);
    node_.hostname = host_name();
    DST_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, node_.world_rank,
                                      MPI_INFO_NULL, &local));
    DST_MPI_CHECK(MPI_Comm_rank(local, &node_.local_rank));
    DST_MPI_CHECK(MPI_Comm_size(local, &node_.local_size));
    MpiCollectives coll = startup_collectives(MPI_COMM_WORLD, init_timeout_s_);
    node_.num_nodes = node_.local_rank == 0 ? 1 : 0;
    coll.allreduce(&node_.num_nodes, 1, MPI_INT, MPI_SUM, "count of nodes");
    node_.max_ranks_per_node = node_.local_size;
    coll.allreduce(&node_.max_ranks_per_node, 1, MPI_INT, MPI_MAX, "ranks per node");
  }
  {
    StartupStep step(*watchdog_, "CPU sharing check (the node's CPU masks, /proc)",
                     init_timeout_s_);
    node_.cpu_crowding = cpu_crowding(local, node_.world_rank, node_.hostname, init_timeout_s_);
    DST_MPI_CHECK(MPI_Comm_free(&local));
  }
  {
    StartupStep step(*watchdog_, "device selection", init_timeout_s_);
    device_ = select_device(node_.local_rank, node_.local_size);
    if (device_.kind == "cuda") compute_stream_ = create_compute_stream();
  }
  {
    StartupStep step(*watchdog_, "Kokkos::initialize", init_timeout_s_);
    // Kokkos parses its own --kokkos-* flags; hand it only the program name so our
    // command line is never reinterpreted (settings come from KOKKOS_* variables).
    int kargc = 1;
    char* kargv[] = {argv[0], nullptr};
    Kokkos::initialize(kargc, kargv);
    kokkos_initialized_ = true;
  }
}

Runtime::~Runtime() {
  destroy_compute_stream(compute_stream_);
  if (kokkos_initialized_) Kokkos::finalize();
  if (mpi_is_up()) MPI_Finalize();
}

std::string Runtime::thread_level() const {
  switch (thread_level_) {
    case MPI_THREAD_SINGLE:
      return "single";
    case MPI_THREAD_FUNNELED:
      return "funneled";
    case MPI_THREAD_SERIALIZED:
      return "serialized";
    case MPI_THREAD_MULTIPLE:
      return "multiple";
  }
  return "unknown";
}

std::string Runtime::kokkos_space() const {
  return Kokkos::DefaultExecutionSpace::name();
}

void agree_or_fail(MPI_Comm comm, bool ok, const std::string& message, int exit_code,
                   double timeout_s, const std::string& step) {
  MpiCollectives coll = startup_collectives(comm, timeout_s);
  const std::string what = step + " (agreement)";
  const int failed = coll.count_failed(!ok, what);
  if (failed == 0) return;
  const auto first =
      coll.first_failure(ok ? std::nullopt : std::optional<std::string>(message), what);
  if (coll.rank() == first->rank) {
    std::string line = message;
    const int size = coll.size();
    if (failed == size && size > 1)
      line += " (same step failed on all " + std::to_string(size) + " ranks)";
    else if (failed > 1)
      line += " (" + std::to_string(failed) + " of " + std::to_string(size) + " ranks failed)";
    log::error(line);
  }
  throw JobFailed(exit_code);
}

config::RunConfig load_deck_collectively(Runtime& rt, const std::string& path,
                                         const std::vector<config::Override>& overrides) {
  const double timeout = rt.init_timeout_s();
  RootResult read;
  {
    StartupStep step(rt.watchdog(), "deck read", timeout);
    if (rt.rank() == 0) read = attempt([&] { return config::read_deck_file(path); });
  }
  // Rank 0's text or error reaches every rank under the deadline: a missing rank ends the
  // job with the step named instead of hanging.
  maybe_stall_for_test(rt.rank(), "deck broadcast");
  {
    StartupStep step(rt.watchdog(), "deck broadcast", 0.0);  // polled below
    read = startup_collectives(rt.world(), timeout).broadcast_result(read, 0, "deck broadcast");
  }
  if (!read.ok) {
    agree_or_fail(rt.world(), rt.rank() != 0, "invalid run deck: " + read.text, kExitDeck, timeout,
                  "deck read");
  }
  config::RunConfig cfg;
  std::string parse_error;
  try {
    cfg = config::load_deck_text(read.text, path, overrides);
  } catch (const Error& e) {
    parse_error = e.what();
  }
  agree_or_fail(rt.world(), parse_error.empty(), "invalid run deck: " + parse_error, kExitDeck,
                timeout, "deck parse");
  return cfg;
}

void abort_job(const std::string& message, int exit_code) {
  log::error(message);
  std::fflush(nullptr);
  if (mpi_is_up()) {
    int size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size > 1) MPI_Abort(MPI_COMM_WORLD, exit_code);
    MPI_Finalize();  // one rank: a clean exit with our own code is clearer than MPI_Abort
  }
  std::_Exit(exit_code);
}

std::vector<std::pair<std::string, std::string>> library_versions() {
  std::vector<std::pair<std::string, std::string>> out;
  {
    std::ostringstream os;
    const int v = KOKKOS_VERSION;  // 30401 or 40xyy: major*10000 + minor*100 + patch
    os << v / 10000 << "." << (v / 100) % 100 << "." << v % 100 << " ("
       << Kokkos::DefaultExecutionSpace::name() << ")";
    out.emplace_back("Kokkos", os.str());
  }
  {
    char text[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
    int len = 0;
    MPI_Get_library_version(text, &len);
    std::string s(text, static_cast<std::size_t>(len));
    const auto nl = s.find_first_of("\r\n,");
    out.emplace_back("MPI", s.substr(0, nl));
  }
  {
    unsigned maj = 0, min = 0, rel = 0;
    H5get_libversion(&maj, &min, &rel);
    std::ostringstream os;
    os << maj << "." << min << "." << rel;
#ifdef H5_HAVE_PARALLEL
    os << " (parallel)";
#else
    os << " (serial)";
#endif
    out.emplace_back("HDF5", os.str());
  }
  return out;
}

namespace {
/// Expert parallelism splits routed experts over the ranks: each holds its own.
bool own_experts(const config::RunConfig& config) {
  return config.parallel.expert > 1 && config.model.n_routed_experts > 0;
}
}  // namespace

Backends resolve_backends(const config::RunConfig& config, const DeviceInfo& device,
                          const int data_ranks, const int nodes) {
  using config::KernelsBackend;
  using config::ParallelBackend;
  using Backend = ComputeBackend;
  Backends b;
  const bool on_gpu = device.kind == "cuda";
  switch (config.kernels.backend) {
    case KernelsBackend::automatic:
      b.kernels = on_gpu ? Backend::cuda : Backend::kokkos;
      break;
    case KernelsBackend::kokkos:
      b.kernels = Backend::kokkos;
      break;
    case KernelsBackend::cuda:
      if (!on_gpu)
        throw DeckError(
            "kernels.backend", "",
            core::built_with_cuda()
                ? "'cuda' but this rank has no CUDA device" +
                      (device.no_gpu_reason.empty() ? std::string()
                                                    : " (" + device.no_gpu_reason + ")") +
                      " (use 'kokkos' or 'auto')"
                : "'cuda' needs a build with DSTRAIN_ENABLE_CUDA=ON (use 'kokkos' or 'auto')");
      b.kernels = Backend::cuda;
      break;
  }
  const std::string kernels = to_string(b.kernels);
  // NCCL sums device memory: it is the gradients' communicator only where the model runs
  // on the GPU, and auto takes it only where there is something to sum: alone in the data
  // group, the gradients stay on the device untouched (train::GradBuckets), and an NCCL
  // communicator would add a bootstrap and its failure modes for nothing.
  // Shared memory sums host memory where every rank can map every other's: the kernels
  // run on the host and the job is on one node. Alone there is nothing to sum.
  switch (config.parallel.backend) {
    case ParallelBackend::automatic:
      if (b.kernels == Backend::cuda)
        b.comm = core::built_with_nccl() && data_ranks > 1 ? CommBackend::nccl : CommBackend::mpi;
      else
        // Expert parallelism's own experts per rank are summed over two groups: MPI only
        // (the deck refuses an explicit shm), with pipeline stages too (each stage holding
        // an MoE block stores its own experts, model::own_expert_storage).
        b.comm = data_ranks > 1 && nodes == 1 && !own_experts(config) ? CommBackend::shm
                                                                      : CommBackend::mpi;
      break;
    case ParallelBackend::mpi:
      b.comm = CommBackend::mpi;
      break;
    case ParallelBackend::shm:
      if (own_experts(config))
        throw DeckError("parallel.backend", "",
                        "'shm' adds one flat gradient buffer over the whole data group, but with "
                        "parallel.expert " +
                            std::to_string(config.parallel.expert) +
                            " each rank holds only its own routed experts, summed over the "
                            "ranks holding the same ones: use 'mpi' or 'auto'");
      if (b.kernels != Backend::kokkos)
        throw DeckError("parallel.backend", "",
                        "'shm' sums gradients in host memory, but kernels.backend is '" + kernels +
                            "' (device memory): use 'mpi', 'nccl' or 'auto'");
      if (nodes > 1)
        throw DeckError("parallel.backend", "",
                        "'shm' needs every rank on one node, but this job spans " +
                            std::to_string(nodes) + " nodes: use 'mpi' or 'auto'");
      b.comm = CommBackend::shm;
      break;
    case ParallelBackend::nccl:
      if (!core::built_with_nccl())
        throw DeckError("parallel.backend", "",
                        "'nccl' needs a build with DSTRAIN_ENABLE_NCCL=ON; this build has MPI "
                        "only (use 'mpi' or 'auto')");
      if (b.kernels != Backend::cuda)
        throw DeckError("parallel.backend", "",
                        "'nccl' sums gradients in GPU memory, but kernels.backend is '" + kernels +
                            "' (host memory): use 'mpi' or 'auto', or kernels.backend 'cuda'");
      b.comm = CommBackend::nccl;
      break;
  }
  return b;
}

std::string describe_layout(const Runtime& rt, const config::Layout& layout, const Backends& b) {
  const auto& n = rt.node();
  std::ostringstream os;
  os << "layout: " << n.world_size << " rank" << (n.world_size == 1 ? "" : "s") << " on "
     << n.num_nodes << " node" << (n.num_nodes == 1 ? "" : "s") << " (up to "
     << n.max_ranks_per_node << " per node) | data " << layout.data << " x tensor " << layout.tensor
     << " x pipeline " << layout.pipeline
     << (layout.expert > 1 ? " (experts over groups of " + std::to_string(layout.expert) + ")"
                           : std::string())
     << " | comm " << to_string(b.comm) << " | kernels " << to_string(b.kernels) << " (Kokkos "
     << rt.kokkos_space() << ") | device " << rt.device().kind;
  if (!rt.device().name.empty()) os << " (" << rt.device().name << ")";
  if (rt.device().kind == "cuda") {
    char mem[64];
    std::snprintf(mem, sizeof mem, " %d, %.1f GiB", rt.device().index,
                  static_cast<double>(rt.device().memory_bytes) / (1024.0 * 1024.0 * 1024.0));
    os << mem;
  }
  os << " | MPI threads " << rt.thread_level();
  return os.str();
}

int rank_from_environment() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (const char* v = std::getenv(var)) {
      char* end = nullptr;
      const long r = std::strtol(v, &end, 10);
      if (end != v && *end == '\0' && r >= 0) return static_cast<int>(r);
    }
  }
  return -1;
}

void maybe_stall_for_test(int rank, const std::string& step) {
  const char* r = std::getenv("DSTRAIN_DEBUG_STALL_RANK");
  const char* s = std::getenv("DSTRAIN_DEBUG_STALL_STEP");
  if (!r || !s || std::atoi(r) != rank || step != s) return;
  log::warn("fault injection: stalling in start-up step '" + step + "' (DSTRAIN_DEBUG_STALL_*)");
  std::this_thread::sleep_for(std::chrono::seconds(600));
}

}  // namespace dst::runtime
