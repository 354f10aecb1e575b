#pragma once
/// \file nccl_communicator.hpp
/// The NCCL back end of Communicator: device buffers, collectives enqueued on a dedicated
/// CUDA stream, waits that poll a CUDA event and ncclCommGetAsyncError against the
/// deadline. Built only with DSTRAIN_ENABLE_NCCL=ON (DSTRAIN_HAVE_NCCL); this header
/// names no NCCL or CUDA type, so callers need neither header. See docs/nccl.md.

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.hpp"

// Opaque handles as nccl.h and cuda_runtime.h declare them.
struct ncclComm;
struct CUstream_st;
struct CUevent_st;

namespace dst::comm {

/// Collectives over one NCCL communicator on the calling rank's current CUDA device.
///
/// Start-up (make_nccl_communicator): group rank 0 makes the unique id, the MPI group
/// broadcasts it (nccl_bootstrap.hpp), every rank calls ncclCommInitRankConfig with
/// config.blocking = 0 and polls ncclCommGetAsyncError until ready, an error, or the
/// init deadline; on either failure ncclCommAbort runs and a dst::Error /
/// dst::TimeoutError names the group and the call.
///
/// Ordering: collectives run on this communicator's own stream (cudaStreamNonBlocking),
/// which first waits (cudaStreamWaitEvent) for the work already enqueued on the compute
/// stream (set_compute_stream; default: the legacy default stream), so a gradient bucket
/// is reduced as soon as the backward kernels that produced it are done, while later
/// backward kernels run. Each request records a CUDA event after its collective:
/// Request::test() is cudaEventQuery plus ncclCommGetAsyncError, wait() polls both
/// against timeout_s() and, on a timeout or an asynchronous NCCL error, aborts the
/// communicator (ncclCommAbort: every later call on it throws) and throws naming the
/// collective, the group, the step and the rank. Requests record begin/end in the flight
/// recorder, which the hang watchdog watches.
///
/// Buffers are device memory (or memory NCCL can reach); counts are elements. Every
/// DType maps to an NCCL type (bf16 and f16 reduce natively). reduce_scatter with
/// send == recv leaves the result in the first recv_count elements, as the MPI back end
/// does (one device-to-device copy on the stream for ranks other than 0).
///
/// Requests must not outlive their communicator. Not thread-safe.
class NcclCommunicator final : public Communicator {
 public:
  /// Takes over an initialised NCCL communicator (ready, not in progress) of `size`
  /// ranks in which this process is `rank`. Creates the stream and a barrier scratch
  /// word on the current device. Use make_nccl_communicator.
  NcclCommunicator(ncclComm* comm, int rank, int size, std::string name, double timeout_s);
  /// Finalises the communicator (ncclCommFinalize, polled for up to timeout_s(), then
  /// ncclCommDestroy) or, if that fails or it was aborted, aborts it; never throws.
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  double timeout_s() const override { return timeout_s_; }
  void set_timeout_s(double seconds) override { timeout_s_ = seconds; }
  bool device_memory() const override { return true; }

  Request iallreduce(void* buf, std::size_t count, DType type, ReduceOp op) override;
  Request ireduce_scatter(const void* send, void* recv, std::size_t recv_count, DType type,
                          ReduceOp op) override;
  Request iallgather(const void* send, void* recv, std::size_t send_count, DType type) override;
  Request ibroadcast(void* buf, std::size_t count, DType type, int root) override;
  /// A 1-element allreduce on a scratch word: complete when every rank has reached it.
  Request ibarrier() override;
  /// ZeRO's shard collectives (Communicator), in place on `buf` (device memory): one
  /// ncclReduce of each rank's block to that rank, all in one ncclGroupStart/End on the
  /// communicator's stream, so they run as one operation. The summation order is NCCL's
  /// reduce's, not necessarily its all-reduce's: the bits may differ from iallreduce's.
  /// Throws dst::Error unless `counts` has one entry per rank.
  Request ireduce_scatter_blocks(void* buf, const std::vector<std::size_t>& counts, DType type,
                                 ReduceOp op) override;
  /// One ncclBroadcast of each rank's block from that rank, grouped as above.
  Request iallgather_blocks(void* buf, const std::vector<std::size_t>& counts, DType type) override;
  /// Grouped ncclSend/ncclRecv, one pair per peer with a non-empty block (self included).
  Request ialltoall(const void* send, void* recv, std::size_t count, DType type) override;
  Request ialltoallv(const void* send, const std::vector<std::size_t>& send_counts, void* recv,
                     const std::vector<std::size_t>& recv_counts, DType type) override;

  /// The stream whose work a collective waits for before it starts (a cudaStream_t;
  /// nullptr: the legacy default stream). Typically the stream the backward pass runs on.
  void set_compute_stream(CUstream_st* stream) { compute_stream_ = stream; }
  /// The stream the collectives run on (a cudaStream_t), e.g. for consumers that want to
  /// order their kernels after a collective with cudaStreamWaitEvent instead of waiting.
  CUstream_st* stream() const { return stream_; }
  CUstream_st* compute_stream() const { return compute_stream_; }

  /// True once the communicator was aborted (a timeout or NCCL error); every later
  /// collective throws dst::Error.
  bool aborted() const { return aborted_; }
  /// ncclCommAbort, once (later calls do nothing). Never throws; failures are logged.
  void abort() noexcept;

  /// The NCCL handle (an ncclComm_t), for code that calls NCCL directly. Owned here.
  ncclComm* nccl_comm() const { return comm_; }

 private:
  /// Makes the stream wait for the compute stream, runs `nccl_call` (the NCCL collective,
  /// returning its ncclResult_t as int), waits until a non-blocking enqueue has been
  /// issued (ncclInProgress), runs `after` (extra stream work, may be empty) and records
  /// `done` on the stream. Throws dst::Error naming describe() if any step fails.
  void enqueue(const std::function<std::string()>& describe, const std::function<int()>& nccl_call,
               const std::function<void()>& after, CUevent_st* done);
  /// Throws dst::Error naming `what` if the communicator was aborted.
  void check_usable(const std::function<std::string()>& describe) const;

  ncclComm* comm_ = nullptr;
  CUstream_st* stream_ = nullptr;
  CUstream_st* compute_stream_ = nullptr;
  CUevent_st* inputs_ready_ = nullptr;  ///< recorded on the compute stream per collective
  void* barrier_word_ = nullptr;        ///< one f32 in device memory
  std::string name_;
  double timeout_s_;
  int rank_ = 0;
  int size_ = 1;
  bool aborted_ = false;
  std::string abort_reason_;
};

/// Makes the NCCL communicator of the ranks of `mpi_group` (an MPI communicator, e.g. a
/// ProcessGroups member): rank 0 of the group makes the NCCL unique id, exchange_unique_id
/// broadcasts it (deadline `init_timeout_s`), then ncclCommInitRankConfig runs
/// non-blocking, polled against `init_timeout_s`. `timeout_s` becomes the deadline of
/// every collective. Collective over `mpi_group`. Uses the current CUDA device.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& mpi_group, std::string name,
                                                     double timeout_s, double init_timeout_s);

}  // namespace dst::comm
