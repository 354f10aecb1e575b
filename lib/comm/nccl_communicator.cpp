// The NCCL back end (docs/nccl.md). Compiled only when DSTRAIN_ENABLE_NCCL=ON; the MPI
// side of start-up and the polling loops live in nccl_bootstrap.cpp, tested on CPU.
#if DSTRAIN_HAVE_NCCL

#include "comm/nccl_communicator.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "comm/nccl_bootstrap.hpp"
#include "comm/op_info.hpp"
#include "core/error.hpp"
#include "core/flight_recorder.hpp"
#include "core/log.hpp"

static_assert(sizeof(ncclUniqueId) == dst::comm::kNcclUniqueIdBytes,
              "nccl_bootstrap's NcclUniqueIdBytes must match ncclUniqueId");
static_assert(NCCL_VERSION_CODE >= NCCL_VERSION(2, 19, 0),
              "the NCCL back end needs NCCL >= 2.19 (non-blocking init, ncclConfig_t::commName)");

/// Throws dst::Error naming the CUDA call, its error and file:line.
#define DST_CUDA_CHECK(call)                                                                 \
  do {                                                                                       \
    const cudaError_t dst_cuda_status_ = (call);                                             \
    if (dst_cuda_status_ != cudaSuccess)                                                     \
      throw ::dst::Error(std::string("comm: ") + cudaGetErrorName(dst_cuda_status_) + " (" + \
                         cudaGetErrorString(dst_cuda_status_) + ") from " + #call + " [" +   \
                         __FILE__ + ":" + std::to_string(__LINE__) + "]");                   \
  } while (0)

namespace dst::comm {

namespace {

/// "unhandled system error (NCCL: <last error>)": the result's name and NCCL's own detail.
std::string nccl_error_text(ncclResult_t result, ncclComm_t comm) {
  std::string text = ncclGetErrorString(result);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') text += std::string(" (NCCL: ") + last + ")";
  return text;
}

ncclDataType_t nccl_type(DType type) {
  switch (type) {
    case DType::f32:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::bf16:
      return ncclBfloat16;
    case DType::f16:
      return ncclFloat16;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
    case DType::u8:
      return ncclUint8;
    case DType::u32:
      return ncclUint32;
    case DType::u64:
      return ncclUint64;
  }
  // A DType added later without an NCCL counterpart lands here.
  throw Error("comm: NCCL has no element type for " + std::string(dtype_name(type)));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::max:
      return ncclMax;
    case ReduceOp::min:
      return ncclMin;
  }
  throw Error("comm: unknown reduction");
}

/// ncclCommGetAsyncError as a probe: ready once the communicator has no operation being
/// issued (ncclSuccess), pending while ncclInProgress, an error otherwise.
ProbeResult probe_async_state(ncclComm_t comm) {
  ncclResult_t state = ncclInProgress;
  const ncclResult_t query = ncclCommGetAsyncError(comm, &state);
  if (query != ncclSuccess)
    return ProbeResult::failed("ncclCommGetAsyncError: " + nccl_error_text(query, comm));
  if (state == ncclSuccess) return ProbeResult::ready();
  if (state == ncclInProgress) return ProbeResult::pending();
  return ProbeResult::failed(nccl_error_text(state, comm));
}

/// A collective enqueued on the communicator's stream, complete when its event is.
class NcclRequest final : public Request::Impl {
 public:
  NcclRequest(NcclCommunicator& comm, const OpInfo& info)
      : comm_(comm), info_(info), timeout_s_(comm.timeout_s()) {
    // Timing off: the event only orders and signals (cheaper to record and query).
    DST_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    seq_ = core::FlightRecorder::instance().begin(describe());
  }
  ~NcclRequest() override {
    // A pending event may be destroyed: CUDA releases it when it completes.
    if (event_ != nullptr) cudaEventDestroy(event_);
  }
  NcclRequest(const NcclRequest&) = delete;
  NcclRequest& operator=(const NcclRequest&) = delete;

  cudaEvent_t event() const { return event_; }

  bool test() override {
    if (done_) return true;
    const ProbeResult r = probe();
    if (r.state == ProbeResult::State::error) {
      comm_.abort();
      throw Error(describe() + " failed: " + r.error + "; the communicator was aborted");
    }
    if (r.state == ProbeResult::State::ready) finished();
    return done_;
  }
  void wait() override { wait_for(timeout_s_); }
  void wait_for(double timeout_s) override {
    if (done_) return;
    wait_for_collective([this] { return probe(); }, timeout_s, [this] { return describe(); },
                        [this] { comm_.abort(); });
    finished();
  }
  std::string describe() const override {
    return describe_op("nccl", info_, comm_.name(), comm_.size());
  }

 private:
  ProbeResult probe() {
    if (comm_.aborted()) return ProbeResult::failed("the communicator had been aborted");
    const cudaError_t e = cudaEventQuery(event_);
    if (e == cudaSuccess) {
      // Done on the stream; an error NCCL reported meanwhile still fails it.
      const ProbeResult state = probe_async_state(comm_.nccl_comm());
      return state.state == ProbeResult::State::error ? state : ProbeResult::ready();
    }
    if (e != cudaErrorNotReady)
      // CUDA's errors are sticky: an earlier kernel's fault on any stream of this context
      // (an illegal address in backward) surfaces here too. Rerun with
      // CUDA_LAUNCH_BLOCKING=1 to see which launch it was.
      return ProbeResult::failed(std::string("cudaEventQuery: ") + cudaGetErrorName(e) + " (" +
                                 cudaGetErrorString(e) +
                                 "; a CUDA error, possibly from an earlier kernel on any "
                                 "stream, not necessarily NCCL's)");
    // Still running: a peer may be late (pending) or NCCL may have failed (a network
    // error, a peer's abort), which only ncclCommGetAsyncError tells.
    const ProbeResult state = probe_async_state(comm_.nccl_comm());
    return state.state == ProbeResult::State::error ? state : ProbeResult::pending();
  }
  void finished() {
    if (!done_) core::FlightRecorder::instance().end(seq_);
    done_ = true;
  }

  NcclCommunicator& comm_;
  OpInfo info_;
  double timeout_s_;
  std::uint64_t seq_ = 0;  ///< in the flight recorder
  cudaEvent_t event_ = nullptr;
  bool done_ = false;
};

/// Elements of every block together.
std::size_t total_of(const std::vector<std::size_t>& counts) {
  std::size_t n = 0;
  for (const std::size_t c : counts)
    n += c;
  return n;
}

/// One grouped NCCL call per non-empty block of `buf` (rank order, counts[r] elements of
/// `element_bytes` for rank r): `call(block, count, owner)` returns its ncclResult_t.
/// Returns the first failure, or ncclGroupEnd's result (ncclInProgress on a non-blocking
/// communicator until every call is issued).
template <typename Call>
ncclResult_t grouped_blocks(void* buf, const std::vector<std::size_t>& counts,
                            std::size_t element_bytes, const Call& call) {
  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) return r;
  std::size_t at = 0;
  for (std::size_t owner = 0; owner < counts.size(); ++owner) {
    if (counts[owner] > 0) {
      r = call(static_cast<char*>(buf) + at * element_bytes, counts[owner],
               static_cast<int>(owner));
      if (r != ncclSuccess && r != ncclInProgress) {
        (void)ncclGroupEnd();  // closes the group; the caller aborts the communicator
        return r;
      }
    }
    at += counts[owner];
  }
  return ncclGroupEnd();
}

std::string group_text(const std::string& name, int size) {
  return "group '" + name + "' (" + std::to_string(size) + (size == 1 ? " rank)" : " ranks)");
}

}  // namespace

NcclCommunicator::NcclCommunicator(ncclComm* comm, int rank, int size, std::string name,
                                   double timeout_s)
    : comm_(comm), name_(std::move(name)), timeout_s_(timeout_s), rank_(rank), size_(size) {
  DST_REQUIRE(comm_ != nullptr,
              "comm: NcclCommunicator for group '" << name_ << "' without an NCCL communicator");
  try {
    // Non-blocking: no implicit synchronisation with the legacy default stream, so the
    // collectives overlap compute; ordering is explicit (inputs_ready_, request events).
    DST_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    DST_CUDA_CHECK(cudaEventCreateWithFlags(&inputs_ready_, cudaEventDisableTiming));
    DST_CUDA_CHECK(cudaMalloc(&barrier_word_, sizeof(float)));
    DST_CUDA_CHECK(cudaMemsetAsync(barrier_word_, 0, sizeof(float), stream_));
  } catch (...) {
    if (barrier_word_ != nullptr) cudaFree(barrier_word_);
    if (inputs_ready_ != nullptr) cudaEventDestroy(inputs_ready_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    ncclCommAbort(comm_);
    throw;
  }
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ != nullptr && !aborted_) {
    try {
      const std::string what = "ncclCommFinalize on " + group_text(name_, size_);
      // Flushes the collectives still queued; non-blocking, so poll until it is done.
      const ncclResult_t r = ncclCommFinalize(comm_);
      if (r != ncclSuccess && r != ncclInProgress)
        throw Error(what + " failed: " + nccl_error_text(r, comm_));
      wait_for_collective([this] { return probe_async_state(comm_); }, timeout_s_,
                          [&] { return what; }, [this] { abort(); });
      const ncclResult_t d = ncclCommDestroy(comm_);
      if (d != ncclSuccess && d != ncclInProgress)
        log::error("comm: ncclCommDestroy on " + group_text(name_, size_) + ": " +
                   nccl_error_text(d, nullptr));
      comm_ = nullptr;
    } catch (const std::exception& e) {
      log::error(std::string("comm: closing the NCCL communicator: ") + e.what());
      abort();
    }
  }
  // After ncclCommAbort or ncclCommDestroy nothing of ours runs on the stream any more.
  // Failures here (e.g. the CUDA context is already gone at exit) change nothing.
  if (barrier_word_ != nullptr) cudaFree(barrier_word_);
  if (inputs_ready_ != nullptr) cudaEventDestroy(inputs_ready_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

void NcclCommunicator::abort() noexcept {
  if (aborted_ || comm_ == nullptr) return;
  aborted_ = true;
  const ncclResult_t r = ncclCommAbort(comm_);
  if (r != ncclSuccess)
    log::error("comm: ncclCommAbort on " + group_text(name_, size_) + ": " +
               std::string(ncclGetErrorString(r)));
  comm_ = nullptr;  // freed by ncclCommAbort
}

void NcclCommunicator::check_usable(const std::function<std::string()>& describe) const {
  if (aborted_)
    throw Error(describe() +
                ": the NCCL communicator was aborted after an earlier timeout or error");
}

void NcclCommunicator::enqueue(const std::function<std::string()>& describe,
                               const std::function<int()>& nccl_call,
                               const std::function<void()>& after, CUevent_st* done) {
  // The inputs were produced on the compute stream: start after what is enqueued there
  // now, without waiting on the host.
  DST_CUDA_CHECK(cudaEventRecord(inputs_ready_, compute_stream_));
  DST_CUDA_CHECK(cudaStreamWaitEvent(stream_, inputs_ready_, 0));
  const auto r = static_cast<ncclResult_t>(nccl_call());
  if (r == ncclInvalidArgument || r == ncclInvalidUsage) {
    // Refused before anything was issued: the communicator is still healthy.
    throw Error(describe() + ": NCCL refused to start it: " + nccl_error_text(r, comm_));
  }
  if (r != ncclSuccess && r != ncclInProgress) {
    const std::string text = nccl_error_text(r, comm_);
    abort();
    throw Error(describe() + ": failed to start: " + text + "; the communicator was aborted");
  }
  if (r == ncclInProgress) {
    // Non-blocking communicator: the call returns before the kernel is on the stream;
    // the event may be recorded only once NCCL has issued it.
    wait_for_collective([this] { return probe_async_state(comm_); }, timeout_s_, describe,
                        [this] { abort(); });
  }
  if (after) after();
  DST_CUDA_CHECK(cudaEventRecord(done, stream_));
}

Request NcclCommunicator::iallreduce(void* buf, std::size_t count, DType type, ReduceOp op) {
  const OpInfo info{OpKind::allreduce, op, count, type, 0};
  const auto describe = [&] { return describe_op("nccl", info, name_, size_); };
  check_usable(describe);
  const ncclDataType_t dt = nccl_type(type);
  auto request = std::make_unique<NcclRequest>(*this, info);
  enqueue(
      describe,
      [&] {
        return static_cast<int>(ncclAllReduce(buf, buf, count, dt, nccl_op(op), comm_, stream_));
      },
      {}, request->event());
  return Request(std::move(request));
}

Request NcclCommunicator::ireduce_scatter(const void* send, void* recv, std::size_t recv_count,
                                          DType type, ReduceOp op) {
  const OpInfo info{OpKind::reduce_scatter, op, recv_count, type, 0};
  const auto describe = [&] { return describe_op("nccl", info, name_, size_); };
  check_usable(describe);
  const ncclDataType_t dt = nccl_type(type);
  const std::size_t block_bytes = recv_count * dtype_size(type);
  // NCCL's in-place form writes rank r's block where it was read (send + r * block); the
  // interface promises it at the start of recv, so move it there afterwards.
  const bool in_place = send == recv;
  char* const own_block = static_cast<char*>(recv) + static_cast<std::size_t>(rank_) * block_bytes;
  void* const out = in_place ? static_cast<void*>(own_block) : recv;
  auto request = std::make_unique<NcclRequest>(*this, info);
  enqueue(
      describe,
      [&] {
        return static_cast<int>(
            ncclReduceScatter(send, out, recv_count, dt, nccl_op(op), comm_, stream_));
      },
      [&] {
        if (in_place && rank_ != 0 && block_bytes > 0)
          DST_CUDA_CHECK(
              cudaMemcpyAsync(recv, own_block, block_bytes, cudaMemcpyDeviceToDevice, stream_));
      },
      request->event());
  return Request(std::move(request));
}

Request NcclCommunicator::iallgather(const void* send, void* recv, std::size_t send_count,
                                     DType type) {
  const OpInfo info{OpKind::allgather, ReduceOp::sum, send_count, type, 0};
  const auto describe = [&] { return describe_op("nccl", info, name_, size_); };
  check_usable(describe);
  const ncclDataType_t dt = nccl_type(type);
  auto request = std::make_unique<NcclRequest>(*this, info);
  enqueue(
      describe,
      [&] { return static_cast<int>(ncclAllGather(send, recv, send_count, dt, comm_, stream_)); },
      {}, request->event());
  return Request(std::move(request));
}

Request NcclCommunicator::ibroadcast(void* buf, std::size_t count, DType type, int root) {
  const OpInfo info{OpKind::broadcast, ReduceOp::sum, count, type, root};
  const auto describe = [&] { return describe_op("nccl", info, name_, size_); };
  check_usable(describe);
  if (root < 0 || root >= size_)
    throw Error(describe() + ": root " + std::to_string(root) + " is not a rank of the group");
  const ncclDataType_t dt = nccl_type(type);
  auto request = std::make_unique<NcclRequest>(*this, info);
  enqueue(
      describe,
      [&] { return static_cast<int>(ncclBroadcast(buf, buf, count, dt, root, comm_, stream_)); },
      {}, request->event());
  return Request(std::move(request));
}

Request NcclCommunicator::ireduce_scatter_blocks(void* buf, const std::vector<std::size_t>& counts,
                                                 DType type, ReduceOp op) {
  const std::size_t mine = counts.size() > static_cast<std::size_t>(rank_) ? counts[rank_] : 0;
  const OpInfo info{OpKind::reduce_scatter_blocks, op, total_of(counts), type,
                    static_cast<int>(mine)};
  const auto describe = [&] { return describe_op("nccl", info, name_, size_); };
  check_usable(describe);
  if (counts.size() != static_cast<std::size_t>(size_))
    throw Error(describe() + ": " + std::to_string(counts.size()) + " block sizes for " +
                std::to_string(size_) + " ranks");
  const ncclDataType_t dt = nccl_type(type);
  const ncclRedOp_t red = nccl_op(op);
  auto request = std::make_unique<NcclRequest>(*this, info);
  enqueue(
      describe,
      [&] {
        return static_cast<int>(grouped_blocks(
            buf, counts, dtype_size(type), [&](void* block, std::size_t count, int owner) {
              return ncclReduce(block, block, count, dt, red, owner, comm_, stream_);
            }));
      },
      {}, request->event());
  return Request(std::move(request));
}

Request NcclCommunicator::iallgather_blocks(void* buf, const std::vector<std::size_t>& counts,
                                            DType type) {
  const std::size_t mine = counts.size() > static_cast<std::size_t>(rank_) ? counts[rank_] : 0;
  const OpInfo info{OpKind::allgather_blocks, ReduceOp::sum, total_of(counts), type,
                    static_cast<int>(mine)};
  const auto describe = [&] { return describe_op("nccl", info, name_, size_); };
  check_usable(describe);
  if (counts.size() != static_cast<std::size_t>(size_))
    throw Error(describe() + ": " + std::to_string(counts.size()) + " block sizes for " +
                std::to_string(size_) + " ranks");
  const ncclDataType_t dt = nccl_type(type);
  auto request = std::make_unique<NcclRequest>(*this, info);
  enqueue(
      describe,
      [&] {
        return static_cast<int>(grouped_blocks(
            buf, counts, dtype_size(type), [&](void* block, std::size_t count, int owner) {
              return ncclBroadcast(block, block, count, dt, owner, comm_, stream_);
            }));
      },
      {}, request->event());
  return Request(std::move(request));
}

Request NcclCommunicator::ialltoall(const void* send, void* recv, std::size_t count, DType type) {
  const std::vector<std::size_t> counts(static_cast<std::size_t>(size_), count);
  return ialltoallv(send, counts, recv, counts, type);
}

Request NcclCommunicator::ialltoallv(const void* send, const std::vector<std::size_t>& send_counts,
                                     void* recv, const std::vector<std::size_t>& recv_counts,
                                     DType type) {
  const std::size_t received = total_of(recv_counts);
  const OpInfo info{OpKind::alltoallv, ReduceOp::sum, total_of(send_counts), type,
                    static_cast<int>(std::min<std::size_t>(received, INT_MAX))};
  const auto describe = [&] { return describe_op("nccl", info, name_, size_); };
  check_usable(describe);
  if (send_counts.size() != static_cast<std::size_t>(size_) ||
      recv_counts.size() != static_cast<std::size_t>(size_))
    throw Error(describe() + ": " + std::to_string(send_counts.size()) + " send and " +
                std::to_string(recv_counts.size()) + " receive block sizes for " +
                std::to_string(size_) + " ranks");
  const ncclDataType_t dt = nccl_type(type);
  const std::size_t bytes = dtype_size(type);
  auto request = std::make_unique<NcclRequest>(*this, info);
  enqueue(
      describe,
      [&] {
        // Point-to-point pairs inside one group run concurrently (NCCL >= 2.7); a rank's
        // block for itself is a send to and a receive from itself, which NCCL allows.
        ncclResult_t r = ncclGroupStart();
        if (r != ncclSuccess) return static_cast<int>(r);
        std::size_t sent = 0, got = 0;
        for (int peer = 0; peer < size_; ++peer) {
          const auto p = static_cast<std::size_t>(peer);
          if (send_counts[p] > 0) {
            r = ncclSend(static_cast<const char*>(send) + sent * bytes, send_counts[p], dt, peer,
                         comm_, stream_);
            if (r != ncclSuccess && r != ncclInProgress) break;
          }
          if (recv_counts[p] > 0) {
            r = ncclRecv(static_cast<char*>(recv) + got * bytes, recv_counts[p], dt, peer, comm_,
                         stream_);
            if (r != ncclSuccess && r != ncclInProgress) break;
          }
          sent += send_counts[p];
          got += recv_counts[p];
        }
        if (r != ncclSuccess && r != ncclInProgress) {
          (void)ncclGroupEnd();  // closes the group; the caller aborts the communicator
          return static_cast<int>(r);
        }
        return static_cast<int>(ncclGroupEnd());
      },
      {}, request->event());
  return Request(std::move(request));
}

Request NcclCommunicator::ibarrier() {
  const OpInfo info{OpKind::barrier, ReduceOp::sum, 0, DType::f32, 0};
  const auto describe = [&] { return describe_op("nccl", info, name_, size_); };
  check_usable(describe);
  // NCCL has no barrier: an allreduce completes on a rank only once every rank joined.
  // The compute-stream wait in enqueue() is harmless here (the word is ours).
  auto request = std::make_unique<NcclRequest>(*this, info);
  enqueue(
      describe,
      [&] {
        return static_cast<int>(
            ncclAllReduce(barrier_word_, barrier_word_, 1, ncclFloat32, ncclSum, comm_, stream_));
      },
      {}, request->event());
  return Request(std::move(request));
}

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& mpi_group, std::string name,
                                                     double timeout_s, double init_timeout_s) {
  const int rank = mpi_group.rank();
  const int size = mpi_group.size();
  const std::string what = "ncclCommInitRankConfig on " + group_text(name, size);

  // Only rank 0 makes the id: ncclGetUniqueId opens the bootstrap root's socket.
  NcclUniqueIdBytes bytes{};
  if (rank == 0) {
    ncclUniqueId id;
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess)
      throw Error("comm: ncclGetUniqueId for " + group_text(name, size) +
                  " failed: " + nccl_error_text(r, nullptr));
    std::memcpy(bytes.data(), id.internal, bytes.size());
  }
  exchange_unique_id(mpi_group, bytes, init_timeout_s);
  ncclUniqueId id;
  std::memcpy(id.internal, bytes.data(), bytes.size());

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;             // returns at once; progress is polled below against the deadline
  config.commName = name.c_str();  // shown in NCCL_DEBUG output; copied by NCCL
  ncclComm_t comm = nullptr;
  const auto abort_init = [&comm] {
    if (comm != nullptr) ncclCommAbort(comm);
    comm = nullptr;
  };
  {
    core::FlightScope scope("nccl: " + what + " (issue)");
    const ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      const std::string text = nccl_error_text(r, comm);
      abort_init();
      throw Error(what + " failed: " + text);
    }
  }
  wait_for_init([&comm] { return probe_async_state(comm); }, init_timeout_s, name, size,
                abort_init);
  return std::make_unique<NcclCommunicator>(comm, rank, size, std::move(name), timeout_s);
}

}  // namespace dst::comm

#endif  // DSTRAIN_HAVE_NCCL
