#include "comm/mpi_communicator.hpp"

#include <algorithm>
#include <climits>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "comm/op_info.hpp"
#include "core/error.hpp"
#include "core/flight_recorder.hpp"
#include "core/log.hpp"
#include "runtime/mpi_check.hpp"
#include "runtime/mpi_wait.hpp"

namespace dst::comm {

namespace detail {

MPI_Datatype mpi_datatype(DType type, bool for_reduction, const std::string& what) {
  switch (type) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::f64:
      return MPI_DOUBLE;
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
    case DType::u8:
      return MPI_UINT8_T;
    case DType::u32:
      return MPI_UINT32_T;
    case DType::u64:
      return MPI_UINT64_T;
    case DType::bf16:
    case DType::f16:
      // MPI has no 16-bit float arithmetic; moving them as opaque 16-bit words is exact.
      if (for_reduction)
        throw Error(what + ": MPI cannot reduce " + std::string(dtype_name(type)) +
                    " (no 16-bit float arithmetic); reduce in f32 instead");
      return MPI_UINT16_T;
  }
  throw Error(what + ": unknown element type");
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return MPI_SUM;
    case ReduceOp::max:
      return MPI_MAX;
    case ReduceOp::min:
      return MPI_MIN;
  }
  throw Error("comm: unknown reduction");
}

namespace {

class MpiRequest final : public Request::Impl {
 public:
  MpiRequest(const OpInfo& info, const std::string& group, int group_size, double timeout_s)
      : info_(info),
        group_(group),
        group_size_(group_size),
        timeout_s_(timeout_s),
        seq_(core::FlightRecorder::instance().begin(describe())) {}

  MPI_Request* handle() { return &request_; }
  /// Count and displacement arrays that must outlive the non-blocking call (MPI-3).
  std::vector<int> counts, displs;
  /// Runs once, when the collective has completed (before test() or wait() returns).
  std::function<void()> on_complete;

  bool test() override {
    const bool done = runtime::test_request(request_);
    if (done) finished();
    return done;
  }
  void wait() override { wait_for(timeout_s_); }
  void wait_for(double timeout_s) override {
    runtime::wait_with_deadline(request_, timeout_s, [this] { return describe(); });
    finished();
  }
  std::string describe() const override { return describe_op("comm", info_, group_, group_size_); }

 private:
  MPI_Request request_ = MPI_REQUEST_NULL;
  OpInfo info_;
  std::string group_;
  int group_size_;
  double timeout_s_;
  std::uint64_t seq_;  ///< in the flight recorder
  bool recorded_done_ = false;

  void finished() {
    if (recorded_done_) return;
    recorded_done_ = true;
    core::FlightRecorder::instance().end(seq_);
    if (on_complete) on_complete();
  }
};

int mpi_count(std::size_t count, const MpiRequest& request) {
  // MPI-3 counts are int; larger buffers would need derived datatypes, not needed yet
  // (2^31 f32 elements = 8 GiB in one collective).
  if (count > static_cast<std::size_t>(INT_MAX))
    throw Error(request.describe() + ": count exceeds MPI's int limit (" + std::to_string(INT_MAX) +
                ")");
  return static_cast<int>(count);
}

/// Runs `start` (which issues the MPI call into request's handle) and returns the request;
/// a failure to start is rethrown naming the collective.
template <class Start>
Request start_request(std::unique_ptr<MpiRequest> request, Start&& start) {
  try {
    start(*request);
  } catch (const Error& e) {
    const std::string what = e.what();
    // mpi_datatype()/mpi_count() already lead with the description.
    if (what.rfind("comm: ", 0) == 0) throw;
    throw Error(request->describe() + ": failed to start: " + what);
  }
  return Request(std::move(request));
}

}  // namespace
}  // namespace detail

MpiCommunicator::MpiCommunicator(MPI_Comm parent, std::string name, double timeout_s)
    : name_(std::move(name)), timeout_s_(timeout_s) {
  if (parent == MPI_COMM_NULL)
    throw Error("comm: creating communicator '" + name_ + "' from MPI_COMM_NULL");
  DST_MPI_CHECK(MPI_Comm_dup(parent, &comm_));
  try {
    DST_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    DST_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    DST_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  } catch (...) {
    MPI_Comm_free(&comm_);
    throw;
  }
}

bool MpiCommunicator::concurrent_progress() const {
  int level = MPI_THREAD_SINGLE;
  DST_MPI_CHECK(MPI_Query_thread(&level));
  return level == MPI_THREAD_MULTIPLE;
}

MpiCommunicator::~MpiCommunicator() {
  if (comm_ == MPI_COMM_NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;  // MPI already released everything; freeing now is erroneous
  try {
    DST_MPI_CHECK(MPI_Comm_free(&comm_));
  } catch (const std::exception& e) {
    log::error("comm: freeing communicator '" + name_ + "': " + e.what());
  }
}

Request MpiCommunicator::iallreduce(void* buf, std::size_t count, DType type, ReduceOp op) {
  OpInfo info{OpKind::allreduce, op, count, type, 0};
  auto request = std::make_unique<detail::MpiRequest>(info, name_, size_, timeout_s_);
  return detail::start_request(std::move(request), [&](detail::MpiRequest& r) {
    const MPI_Datatype dt = detail::mpi_datatype(type, true, r.describe());
    DST_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, detail::mpi_count(count, r), dt,
                                 detail::mpi_op(op), comm_, r.handle()));
  });
}

Request MpiCommunicator::ireduce_scatter(const void* send, void* recv, std::size_t recv_count,
                                         DType type, ReduceOp op) {
  OpInfo info{OpKind::reduce_scatter, op, recv_count, type, 0};
  auto request = std::make_unique<detail::MpiRequest>(info, name_, size_, timeout_s_);
  return detail::start_request(std::move(request), [&](detail::MpiRequest& r) {
    const MPI_Datatype dt = detail::mpi_datatype(type, true, r.describe());
    // In place, MPI reads all size()*recv_count inputs from recv and leaves rank r's
    // block at its start.
    const void* in = send == recv ? MPI_IN_PLACE : send;
    DST_MPI_CHECK(MPI_Ireduce_scatter_block(in, recv, detail::mpi_count(recv_count, r), dt,
                                            detail::mpi_op(op), comm_, r.handle()));
  });
}

Request MpiCommunicator::iallgather(const void* send, void* recv, std::size_t send_count,
                                    DType type) {
  OpInfo info{OpKind::allgather, ReduceOp::sum, send_count, type, 0};
  auto request = std::make_unique<detail::MpiRequest>(info, name_, size_, timeout_s_);
  return detail::start_request(std::move(request), [&](detail::MpiRequest& r) {
    const MPI_Datatype dt = detail::mpi_datatype(type, false, r.describe());
    const int n = detail::mpi_count(send_count, r);
    DST_MPI_CHECK(MPI_Iallgather(send, n, dt, recv, n, dt, comm_, r.handle()));
  });
}

namespace {
/// MPI's int counts and displacements of blocks in rank order; throws (naming the
/// collective) when their number is not the group's size or a count or the total
/// exceeds MPI's int.
void block_layout(detail::MpiRequest& r, const std::vector<std::size_t>& counts, int size) {
  if (counts.size() != static_cast<std::size_t>(size))
    throw Error(r.describe() + ": " + std::to_string(counts.size()) + " block counts for " +
                std::to_string(size) + " ranks");
  std::size_t at = 0;
  for (const std::size_t c : counts) {
    r.counts.push_back(detail::mpi_count(c, r));
    r.displs.push_back(detail::mpi_count(at, r));
    at += c;
  }
  detail::mpi_count(at, r);
}

std::size_t total_of(const std::vector<std::size_t>& counts) {
  std::size_t n = 0;
  for (const std::size_t c : counts)
    n += c;
  return n;
}
}  // namespace

Request MpiCommunicator::ireduce_scatter_blocks(void* buf, const std::vector<std::size_t>& counts,
                                                DType type, ReduceOp op) {
  const std::size_t mine = counts.size() > static_cast<std::size_t>(rank_) ? counts[rank_] : 0;
  OpInfo info{OpKind::reduce_scatter_blocks, op, total_of(counts), type, static_cast<int>(mine)};
  auto request = std::make_unique<detail::MpiRequest>(info, name_, size_, timeout_s_);
  return detail::start_request(std::move(request), [&](detail::MpiRequest& r) {
    const MPI_Datatype dt = detail::mpi_datatype(type, true, r.describe());
    block_layout(r, counts, size_);
    // In place, MPI reads every block from buf and leaves this rank's reduced block at
    // buf's start: moved to its own place once complete (memmove: they may overlap).
    const std::size_t bytes = mine * dtype_size(type);
    const std::size_t at = static_cast<std::size_t>(r.displs[rank_]) * dtype_size(type);
    if (at > 0 && bytes > 0)
      r.on_complete = [buf, at, bytes] {
        std::memmove(static_cast<unsigned char*>(buf) + at, buf, bytes);
      };
    DST_MPI_CHECK(MPI_Ireduce_scatter(MPI_IN_PLACE, buf, r.counts.data(), dt, detail::mpi_op(op),
                                      comm_, r.handle()));
  });
}

Request MpiCommunicator::iallgather_blocks(void* buf, const std::vector<std::size_t>& counts,
                                           DType type) {
  const std::size_t mine = counts.size() > static_cast<std::size_t>(rank_) ? counts[rank_] : 0;
  OpInfo info{OpKind::allgather_blocks, ReduceOp::sum, total_of(counts), type,
              static_cast<int>(mine)};
  auto request = std::make_unique<detail::MpiRequest>(info, name_, size_, timeout_s_);
  return detail::start_request(std::move(request), [&](detail::MpiRequest& r) {
    const MPI_Datatype dt = detail::mpi_datatype(type, false, r.describe());
    block_layout(r, counts, size_);
    DST_MPI_CHECK(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, r.counts.data(),
                                  r.displs.data(), dt, comm_, r.handle()));
  });
}

namespace {
void check_peer(const detail::MpiRequest& r, int peer, int self, int size) {
  if (peer < 0 || peer >= size || peer == self)
    throw Error(r.describe() + ": the peer must be another rank of the group (" +
                std::to_string(size) + " ranks, this is rank " + std::to_string(self) + ")");
}
}  // namespace

Request MpiCommunicator::isend(const void* buf, std::size_t count, DType type, int peer, int tag) {
  OpInfo info{OpKind::send, ReduceOp::sum, count, type, peer, tag};
  auto request = std::make_unique<detail::MpiRequest>(info, name_, size_, timeout_s_);
  return detail::start_request(std::move(request), [&](detail::MpiRequest& r) {
    check_peer(r, peer, rank_, size_);
    const MPI_Datatype dt = detail::mpi_datatype(type, false, r.describe());
    DST_MPI_CHECK(MPI_Isend(buf, detail::mpi_count(count, r), dt, peer, tag, comm_, r.handle()));
  });
}

Request MpiCommunicator::irecv(void* buf, std::size_t count, DType type, int peer, int tag) {
  OpInfo info{OpKind::recv, ReduceOp::sum, count, type, peer, tag};
  auto request = std::make_unique<detail::MpiRequest>(info, name_, size_, timeout_s_);
  return detail::start_request(std::move(request), [&](detail::MpiRequest& r) {
    check_peer(r, peer, rank_, size_);
    const MPI_Datatype dt = detail::mpi_datatype(type, false, r.describe());
    DST_MPI_CHECK(MPI_Irecv(buf, detail::mpi_count(count, r), dt, peer, tag, comm_, r.handle()));
  });
}

Request MpiCommunicator::ialltoall(const void* send, void* recv, std::size_t count, DType type) {
  OpInfo info{OpKind::alltoall, ReduceOp::sum, count, type, 0};
  auto request = std::make_unique<detail::MpiRequest>(info, name_, size_, timeout_s_);
  return detail::start_request(std::move(request), [&](detail::MpiRequest& r) {
    const MPI_Datatype dt = detail::mpi_datatype(type, false, r.describe());
    const int n = detail::mpi_count(count, r);
    DST_MPI_CHECK(MPI_Ialltoall(send, n, dt, recv, n, dt, comm_, r.handle()));
  });
}

Request MpiCommunicator::ialltoallv(const void* send, const std::vector<std::size_t>& send_counts,
                                    void* recv, const std::vector<std::size_t>& recv_counts,
                                    DType type) {
  OpInfo info{OpKind::alltoallv, ReduceOp::sum, total_of(send_counts), type,
              static_cast<int>(std::min<std::size_t>(total_of(recv_counts), INT_MAX))};
  auto request = std::make_unique<detail::MpiRequest>(info, name_, size_, timeout_s_);
  return detail::start_request(std::move(request), [&](detail::MpiRequest& r) {
    const MPI_Datatype dt = detail::mpi_datatype(type, false, r.describe());
    block_layout(r, send_counts, size_);  // r.counts, r.displs: the send side
    // The receive side's arrays follow the send side's in the same vectors (they must
    // outlive the call): [0, size) send, [size, 2 size) receive.
    block_layout(r, recv_counts, size_);
    const int* sc = r.counts.data();
    const int* sd = r.displs.data();
    DST_MPI_CHECK(
        MPI_Ialltoallv(send, sc, sd, dt, recv, sc + size_, sd + size_, dt, comm_, r.handle()));
  });
}

Request MpiCommunicator::ibroadcast(void* buf, std::size_t count, DType type, int root) {
  OpInfo info{OpKind::broadcast, ReduceOp::sum, count, type, root};
  auto request = std::make_unique<detail::MpiRequest>(info, name_, size_, timeout_s_);
  return detail::start_request(std::move(request), [&](detail::MpiRequest& r) {
    if (root < 0 || root >= size_)
      throw Error(r.describe() + ": root " + std::to_string(root) + " is not a rank of the group");
    const MPI_Datatype dt = detail::mpi_datatype(type, false, r.describe());
    DST_MPI_CHECK(MPI_Ibcast(buf, detail::mpi_count(count, r), dt, root, comm_, r.handle()));
  });
}

Request MpiCommunicator::ibarrier() {
  OpInfo info{OpKind::barrier, ReduceOp::sum, 0, DType::u8, 0};
  auto request = std::make_unique<detail::MpiRequest>(info, name_, size_, timeout_s_);
  return detail::start_request(std::move(request), [&](detail::MpiRequest& r) {
    DST_MPI_CHECK(MPI_Ibarrier(comm_, r.handle()));
  });
}

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, std::string name,
                                                    double timeout_s) {
  return std::make_unique<MpiCommunicator>(comm, std::move(name), timeout_s);
}

MPI_Comm mpi_comm_of(const Communicator& comm) {
  if (const auto* mpi = dynamic_cast<const MpiCommunicator*>(&comm)) return mpi->mpi_comm();
  throw Error("comm: group '" + comm.name() +
              "' is not an MPI communicator (no MPI_Comm under it)");
}

}  // namespace dst::comm
