#pragma once
/// \file shared_sum.hpp
/// An in-place sum all-reduce, and an in-place all-gather, over f32 buffers that live in
/// one node's shared memory: the data-parallel gradients (summed) and parameters
/// (gathered after each rank updated its part) of ranks that share a node
/// (parallel.backend shm).
///
/// Every rank's buffer is a segment of one MPI shared-memory window
/// (MPI_Win_allocate_shared), so each rank reads and writes its peers' buffers directly.
/// A sum of a range splits it into one contiguous part per rank; rank r adds part r of
/// every buffer, in rank order, and writes the sum into part r of every buffer. Each rank
/// thus reads and writes each element of the range once, and no element travels through
/// a message queue: Open MPI's shared-memory all-reduce copies every element into a
/// queue, out of it and through an add on both ranks (about seven passes over the
/// buffer against two here; docs/performance.md has the measurement).
///
/// Synchronisation is two counters per slot and rank in the window: `ready` (this rank's
/// range is final and may be read) and `done` (this rank has written its part into every
/// buffer). A slot's n-th sum waits for every rank's ready >= n, adds, sets done = n, and
/// is complete when every rank's done >= n; only then may a rank write that range again.
/// The work happens inside Request::test() and wait(), like Open MPI's progress, so a
/// progress thread that polls the requests does it while the backward computes. Every
/// wait has the communicator's deadline; a timeout names the ranks that had not started
/// or not finished their part.
///
/// Every element is added by one rank in a fixed order (rank 0 + rank 1 + ...), so every
/// rank ends with the same bits, run after run. For two ranks these are MPI's bits too
/// (a + b == b + a in IEEE arithmetic).
///
/// A gather uses the same parts and counters: once every rank has marked the range ready
/// (its own part final, the rest free to be written), rank r copies its part into every
/// other buffer. A rank may hold several buffers of the same size (`buffers`); each
/// operation names the one it works on, and the slots are shared by all of them.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <mpi.h>

#include "comm/communicator.hpp"

namespace dst::comm {

class SharedSum {
 public:
  /// Collective over `group` (an MPI communicator whose ranks all share one node; throws
  /// dst::Error naming the group otherwise). Every rank gets a buffer of `elements` f32
  /// (zero-filled, 64-byte aligned) and `slots` independent slots. The first step is a
  /// barrier with the group's deadline, so a missing rank is a TimeoutError, not a hang.
  /// `buffers`: buffers of `elements` f32 per rank (buffer 0, 1, ...).
  SharedSum(Communicator& group, std::size_t elements, std::size_t slots, std::size_t buffers = 1);
  /// Frees the window after a barrier with the group's deadline. While an exception
  /// propagates (the job is ending) it frees nothing: MPI_Win_free is collective and the
  /// peers may never reach it.
  ~SharedSum();
  SharedSum(const SharedSum&) = delete;
  SharedSum& operator=(const SharedSum&) = delete;

  /// This rank's buffer `buffer` (host memory, elements() f32).
  float* local(std::size_t buffer = 0) const { return segment(rank_, buffer); }
  std::size_t elements() const { return elements_; }
  std::size_t slots() const { return slots_; }
  std::size_t buffers() const { return buffers_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  Communicator& group() const { return group_; }

  /// Starts the sum of [begin, begin + count) of every rank's buffer, in place, on slot
  /// `slot`. This rank's range must be final (it is read by the peers from now on) and
  /// must not be written until the request completes. Every rank starts the same ranges
  /// on the same slots in the same order; a slot takes its next sum only once its last
  /// one has completed on this rank (else dst::Error).
  /// `scan`: the rank adding each part also checks every rank's values in it for NaN and
  /// infinity, as it reads them anyway, and keeps each rank's first non-finite element
  /// (first_nonfinite()): a sum's inputs are gone once it completes, and this names the
  /// rank whose own values were not finite without a pass of its own over them.
  Request isum(std::size_t slot, std::size_t begin, std::size_t count, std::size_t buffer = 0,
               bool scan = false);

  /// The lowest element offset (in the buffer) at which this rank's own values were
  /// non-finite in a scanned sum since reset_nonfinite(), or -1. Read it once the sums
  /// have completed (their peers' checks of this rank's values are done by then).
  std::int64_t first_nonfinite() const;
  /// Forgets it: call before starting the next scanned sums (a peer checks this rank's
  /// values only once this rank has started a sum, so none is lost).
  void reset_nonfinite();

  /// Starts the all-gather of [begin, begin + count) of buffer `buffer`, in place, on slot
  /// `slot`: this rank's part of the range (part_of) is final in its own buffer; when the
  /// request completes, every rank's buffer holds every rank's part. Until then this rank
  /// must neither write its part nor read or write the rest of the range (the peers write
  /// it). Slots and ordering as isum.
  Request igather(std::size_t slot, std::size_t begin, std::size_t count, std::size_t buffer);

  /// The contiguous part of a range of `count` elements that rank `r` adds: [first,
  /// last) relative to the range's start. Parts are whole 64-byte lines (16 f32, except
  /// the last) so that no two ranks write the same cache line.
  static void part_of(std::size_t count, int ranks, int r, std::size_t& first, std::size_t& last);

 private:
  class Op;
  friend class Op;

  /// The two counters of (rank, slot).
  std::atomic<std::uint64_t>& ready(int rank, std::size_t slot) const;
  std::atomic<std::uint64_t>& done(int rank, std::size_t slot) const;
  /// Rank `rank`'s first non-finite element in scanned sums (UINT64_MAX: none), in its
  /// counters' line after the slots'; any rank's adder lowers it.
  std::atomic<std::uint64_t>& nonfinite(int rank) const;
  enum class Kind { sum, gather };
  /// Rank `rank`'s buffer `buffer`.
  float* segment(int rank, std::size_t buffer) const {
    return segments_[static_cast<std::size_t>(rank) * buffers_ + buffer];
  }
  Request start(Kind kind, std::size_t slot, std::size_t begin, std::size_t count,
                std::size_t buffer, bool scan);
  /// Adds part `rank_` of [begin, begin + count) over every rank's buffer `buffer` and
  /// stores it in each; `scan`: also records each rank's first non-finite value in it.
  void add_my_part(std::size_t begin, std::size_t count, std::size_t buffer, bool scan) const;
  /// Lowers rank `rank`'s first non-finite offset to that of the first non-finite of the
  /// `n` values at buffer offset `offset` (there is one).
  void record_nonfinite(int rank, const float* values, std::size_t n, std::size_t offset) const;
  /// Copies part `rank_` of [begin, begin + count) of this rank's buffer `buffer` into
  /// every peer's.
  void copy_my_part(std::size_t begin, std::size_t count, std::size_t buffer) const;

  Communicator& group_;
  std::size_t elements_;
  std::size_t slots_;
  std::size_t buffers_;
  int rank_ = 0;
  int size_ = 1;
  MPI_Comm node_ = MPI_COMM_NULL;
  MPI_Win window_ = MPI_WIN_NULL;
  std::vector<float*> segments_;          ///< every rank's buffers, rank-major
  std::vector<unsigned char*> flags_;     ///< every rank's counters
  std::vector<std::uint64_t> uses_;       ///< sums started per slot by this rank
  std::vector<std::uint64_t> completed_;  ///< the last of them seen complete
  int uncaught_at_start_ = 0;
};

}  // namespace dst::comm
