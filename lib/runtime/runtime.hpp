#pragma once
/// \file runtime.hpp
/// Process start-up and shut-down, in the order of ARCHITECTURE.md:
/// MPI_Init_thread -> node-local rank (MPI_Comm_split_type SHARED) -> device = local
/// rank mod devices -> Kokkos::initialize. Each step runs under the start-up watchdog;
/// its failure names the step. Destruction finalises Kokkos, then MPI.

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config/deck.hpp"
#include "core/compute_backend.hpp"
#include "core/enum_names.hpp"
#include "runtime/startup_watchdog.hpp"

namespace dst::runtime {

/// Where this process sits in the job.
struct NodeInfo {
  int world_rank = 0;
  int world_size = 1;
  int local_rank = 0;  ///< rank among the processes of this node
  int local_size = 1;
  int num_nodes = 1;
  int max_ranks_per_node = 1;
  std::string hostname;
  /// On the node's first rank: a warning when this node's ranks and the machine's other
  /// dstrain processes are confined to fewer CPUs than they are (cpu_binding.hpp);
  /// empty otherwise.
  std::string cpu_crowding;
};

/// The compute device this rank drives.
struct DeviceInfo {
  std::string kind = "host";                   ///< "host" or "cuda"
  int index = -1;                              ///< CUDA device ordinal; -1 on host
  std::string name;                            ///< CPU model or GPU name
  std::uint64_t memory_bytes = 0;              ///< device memory (host: MemTotal)
  std::uint64_t available_bytes_per_rank = 0;  ///< free memory / ranks sharing it
  /// A CUDA build on a machine without a usable GPU runs on the host; why (the CUDA
  /// runtime's answer), for the message that refuses kernels.backend cuda. Empty otherwise.
  std::string no_gpu_reason;
};

class Runtime {
 public:
  /// Runs the start-up sequence; `init_timeout_s` bounds each step (the deck's
  /// parallel.init_timeout_s is not known yet: it comes from --init-timeout).
  Runtime(int& argc, char**& argv, double init_timeout_s);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  const NodeInfo& node() const { return node_; }
  const DeviceInfo& device() const { return device_; }
  /// The stream the model runs on when this rank drives a CUDA device (a cudaStream_t),
  /// else nullptr. Destroyed with the Runtime: everything using it must be gone first.
  void* compute_stream() const { return compute_stream_; }
  MPI_Comm world() const { return MPI_COMM_WORLD; }
  int rank() const { return node_.world_rank; }
  int size() const { return node_.world_size; }
  /// "single", "funneled", "serialized" or "multiple".
  std::string thread_level() const;
  /// Kokkos default execution space name ("Serial", "OpenMP", "Cuda", ...).
  std::string kokkos_space() const;
  double init_timeout_s() const { return init_timeout_s_; }
  void set_init_timeout_s(double s) { init_timeout_s_ = s; }
  StartupWatchdog& watchdog() { return *watchdog_; }

 private:
  std::unique_ptr<StartupWatchdog> watchdog_;
  double init_timeout_s_;
  int thread_level_ = MPI_THREAD_SINGLE;
  bool kokkos_initialized_ = false;
  NodeInfo node_;
  DeviceInfo device_;
  void* compute_stream_ = nullptr;
};

/// Thrown after every rank agreed that the job failed and the message was printed
/// once; the application finalises and exits with `exit_code` without printing more.
class JobFailed : public std::exception {
 public:
  explicit JobFailed(int exit_code) : exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }
  const char* what() const noexcept override { return "job failed (already reported)"; }

 private:
  int exit_code_;
};

/// Collective agreement on a step every rank performs: each rank says whether it
/// succeeded. If any failed, the lowest failing rank prints its message once (adding
/// how many ranks failed), and every rank throws JobFailed(exit_code). Waits under
/// `timeout_s`.
void agree_or_fail(MPI_Comm comm, bool ok, const std::string& message, int exit_code,
                   double timeout_s, const std::string& step);

/// Rank 0 reads the deck file (size-limited), broadcasts the text; every rank parses it
/// with the same overrides. Deck errors are reported once and end the job on every rank
/// with kExitDeck (JobFailed).
config::RunConfig load_deck_collectively(Runtime& rt, const std::string& path,
                                         const std::vector<config::Override>& overrides);

/// Prints `[rank R] error: <message>` and ends the whole job: MPI_Abort if MPI is up,
/// otherwise _Exit. Never returns.
[[noreturn]] void abort_job(const std::string& message, int exit_code);

/// Library versions for --version (works before MPI_Init).
std::vector<std::pair<std::string, std::string>> library_versions();

/// Who sums a data group's gradients, once parallel.backend is resolved.
enum class CommBackend : std::uint8_t {
  mpi,   ///< MPI all-reduces (comm::Communicator)
  shm,   ///< one node's shared memory (comm::SharedSum)
  nccl,  ///< NCCL on the GPU (comm::NcclCommunicator)
};

/// The back ends a run uses after resolving "auto" against this build and device.
struct Backends {
  CommBackend comm = CommBackend::mpi;
  ComputeBackend kernels = ComputeBackend::kokkos;  ///< tensor::Backend
};

/// Resolves parallel.backend and kernels.backend for a rank of a data group of
/// `data_ranks` ranks in a job on `nodes` nodes: auto = cuda kernels on a GPU; gradients
/// by NCCL where the kernels are cuda, the build has NCCL and data_ranks > 1; by shared
/// memory (shm, comm::SharedSum) where the kernels run on the host, data_ranks > 1 and
/// the job is on one node; by MPI otherwise. A choice this build, device or job cannot
/// honour is a DeckError naming the key.
Backends resolve_backends(const config::RunConfig& config, const DeviceInfo& device, int data_ranks,
                          int nodes = 1);

/// The one-line layout summary rank 0 prints at start-up.
std::string describe_layout(const Runtime& rt, const config::Layout& layout, const Backends& b);

/// This process's rank as told by the launcher's environment (Open MPI, PMIx, PMI,
/// Slurm) before MPI is initialised; -1 if unknown. Used so that errors before MPI_Init
/// are printed by one rank only.
int rank_from_environment();

/// For start-up fault-injection tests: if the environment names this rank and step
/// (DSTRAIN_DEBUG_STALL_RANK=R, DSTRAIN_DEBUG_STALL_STEP=<step>), sleep far longer
/// than any deadline, staying alive, so the other ranks' deadline is what ends the job.
void maybe_stall_for_test(int rank, const std::string& step);

}  // namespace dst::runtime

namespace dst {
template <>
struct EnumNames<runtime::CommBackend> {
  static constexpr std::array<const char*, 3> names{"mpi", "shm", "nccl"};
};
}  // namespace dst
