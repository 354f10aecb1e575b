#pragma once
/// \file communicator.hpp
/// Collectives over one process group, with a deadline on every wait.
///
/// Every collective is started non-blocking and returns a Request; the blocking forms
/// are start + wait. A wait that passes its deadline throws dst::TimeoutError whose
/// message names the operation, its size, the group, the step and the waiting rank;
/// the application turns that into a job abort. Open MPI makes no asynchronous
/// progress, so waiting is polling (MPI_Test) against the clock.

#include <cstddef>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.hpp"

namespace dst::comm {

enum class ReduceOp { sum, max, min };

/// A started collective. Move-only; waiting twice is an error. Destroying a request that
/// was never waited for waits for it (with its deadline).
///
/// Life cycle and failure rules (a destructor must not throw, and a pending collective
/// must not outlive its buffers):
/// - wait() that succeeds empties the request; a second wait() throws dst::Error.
///   test() returning true does not empty it: wait() afterwards returns at once.
/// - wait() that throws (TimeoutError, MPI error) leaves the request pending and valid:
///   the caller may wait_for() again (tests do, to leave the ranks consistent), or let
///   the error end the job. Destroying such a request does not wait again (its deadline
///   has already passed) and leaves the MPI operation pending; its buffers must then stay
///   alive until the job ends, which the abort that follows such an error ensures.
/// - Destroying a never-waited request while an exception is propagating (stack
///   unwinding from another error) does not wait either: waiting could add a whole
///   deadline before the job-ending error reaches main. It logs a warning naming the
///   collective and leaves it pending, as above.
/// - Otherwise destroying a never-waited request waits with its deadline; if that wait
///   fails the destructor logs the error (dst::log::error, naming the collective, the
///   step and the rank) and calls std::terminate(), which ends the whole MPI job: there
///   is no way to report the failure to the caller, and continuing would leave a
///   collective writing into freed memory.
class Request {
 public:
  class Impl {
   public:
    virtual ~Impl() = default;
    virtual bool test() = 0;  ///< true when complete
    virtual void wait() = 0;  ///< throws TimeoutError past the deadline
    /// Waits with an explicit deadline in seconds (<= 0: no deadline).
    virtual void wait_for(double timeout_s) = 0;
    /// What this request is, for messages: "comm: allreduce(sum) of 4096 x f32 ...".
    virtual std::string describe() const = 0;
  };

  Request() = default;
  explicit Request(std::unique_ptr<Impl> impl)
      : impl_(std::move(impl)), uncaught_at_start_(std::uncaught_exceptions()) {}
  Request(Request&&) noexcept = default;
  /// Settles the collective held so far exactly as the destructor would, then takes over.
  Request& operator=(Request&&) noexcept;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  ~Request();

  /// Polls once; true when the collective has completed (or the request is empty).
  bool test();
  /// Waits until completion or the deadline (throws dst::TimeoutError). Throws dst::Error
  /// on an empty request (already waited, moved from, default-constructed).
  void wait();
  /// Like wait(), with an explicit deadline instead of the communicator's (<= 0: none).
  /// Meant for recovering a request whose wait() timed out, e.g. in tests.
  void wait_for(double timeout_s);
  /// True while the request holds a collective that wait() has not completed.
  bool valid() const { return impl_ != nullptr; }

 private:
  /// Destructor and move-assignment: settle the held collective without throwing.
  void finish_noexcept() noexcept;

  std::unique_ptr<Impl> impl_;
  bool wait_failed_ = false;  ///< a wait threw; the collective is still pending
  /// std::uncaught_exceptions() when started: more at destruction means unwinding.
  int uncaught_at_start_ = 0;
};

/// A process group and its collectives. Buffers are host memory for the MPI back end
/// (device memory for NCCL). Counts are elements of `type`.
class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Group name used in messages: "world", "data", "tensor", "pipeline".
  virtual const std::string& name() const = 0;
  /// Deadline applied to every wait, in seconds.
  virtual double timeout_s() const = 0;
  virtual void set_timeout_s(double seconds) = 0;
  /// True when a second thread may poll (Request::test) this group's requests while the
  /// thread that owns them starts others: the MPI back end under MPI_THREAD_MULTIPLE.
  /// A back end whose collectives progress on their own (NCCL's streams) says false: it
  /// needs no progress thread.
  virtual bool concurrent_progress() const { return false; }
  /// True when the buffers are device memory (NCCL); false for host memory (MPI). A
  /// caller whose data lives on a device stages it through the host for a host-memory
  /// back end (train::GradBuckets).
  virtual bool device_memory() const { return false; }

  /// In place: every rank ends with op over all ranks' `buf[0:count)`.
  virtual Request iallreduce(void* buf, std::size_t count, DType type, ReduceOp op) = 0;
  /// `send` holds size()*recv_count elements; rank r receives the op-reduction of block r.
  virtual Request ireduce_scatter(const void* send, void* recv, std::size_t recv_count, DType type,
                                  ReduceOp op) = 0;
  /// Every rank contributes `send_count` elements; `recv` gets size()*send_count, by rank.
  virtual Request iallgather(const void* send, void* recv, std::size_t send_count, DType type) = 0;
  /// `buf` of `root` is copied to every rank.
  virtual Request ibroadcast(void* buf, std::size_t count, DType type, int root) = 0;
  virtual Request ibarrier() = 0;

  /// Reduce-scatter in place with blocks of unequal sizes (ZeRO's shards of one gradient
  /// bucket): `buf` holds every rank's block in rank order, counts[r] elements for rank r
  /// (the same counts on every rank; zeros allowed). When the request completes, this
  /// rank's block of `buf` (at its own place) holds the op-reduction of that block over
  /// all ranks; the rest of `buf` is undefined (the back end may have used it). The
  /// summation order is the back end's: for Open MPI 4.1 that of its in-place
  /// iallreduce, so the bits of iallreduce (docs/performance.md, "ZeRO").
  /// The base class throws dst::Error naming the group (a back end without it cannot run
  /// ZeRO); MPI and NCCL implement it.
  virtual Request ireduce_scatter_blocks(void* buf, const std::vector<std::size_t>& counts,
                                         DType type, ReduceOp op);
  /// All-gather in place with blocks of unequal sizes: this rank's block of `buf` (rank
  /// order, counts[r] elements for rank r) is final; when the request completes every
  /// rank's block is, on every rank. Throws dst::Error in the base class (as above).
  virtual Request iallgather_blocks(void* buf, const std::vector<std::size_t>& counts, DType type);
  /// All-to-all: `send` holds size() blocks of `count` elements, block r for rank r;
  /// `recv` gets size() blocks of `count`, block q from rank q (expert parallelism's
  /// exchange of per-expert token counts). Throws dst::Error in the base class.
  virtual Request ialltoall(const void* send, void* recv, std::size_t count, DType type);
  /// All-to-all of blocks of unequal sizes: `send` holds send_counts[r] elements for rank
  /// r in rank order, `recv` gets recv_counts[q] elements from rank q in rank order (each
  /// rank's recv_counts[q] equals rank q's send_counts[this rank]; zeros allowed). The
  /// expert dispatch's token rows. Throws dst::Error in the base class.
  virtual Request ialltoallv(const void* send, const std::vector<std::size_t>& send_counts,
                             void* recv, const std::vector<std::size_t>& recv_counts, DType type);

  /// Point-to-point (pipeline stages): sends `count` elements to group rank `peer`, or
  /// receives them from it; `tag` tells messages between the same two ranks apart (both
  /// sides must use the same). The wait has the communicator's deadline and a timeout
  /// names the operation, its size, the peer and the group. The base class throws
  /// dst::Error naming the group; MPI implements them.
  virtual Request isend(const void* buf, std::size_t count, DType type, int peer, int tag);
  virtual Request irecv(void* buf, std::size_t count, DType type, int peer, int tag);

  void allreduce(void* buf, std::size_t count, DType type, ReduceOp op) {
    iallreduce(buf, count, type, op).wait();
  }
  void reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType type,
                      ReduceOp op) {
    ireduce_scatter(send, recv, recv_count, type, op).wait();
  }
  void allgather(const void* send, void* recv, std::size_t send_count, DType type) {
    iallgather(send, recv, send_count, type).wait();
  }
  void broadcast(void* buf, std::size_t count, DType type, int root) {
    ibroadcast(buf, count, type, root).wait();
  }
  void barrier() { ibarrier().wait(); }

  /// Typed conveniences.
  template <class T>
  void allreduce(T* buf, std::size_t count, ReduceOp op) {
    allreduce(static_cast<void*>(buf), count, dtype_of<T>::value, op);
  }
  template <class T>
  T allreduce_value(T value, ReduceOp op) {
    allreduce(&value, 1, op);
    return value;
  }
};

}  // namespace dst::comm
