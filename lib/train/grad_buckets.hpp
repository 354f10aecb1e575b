#pragma once
/// \file grad_buckets.hpp
/// Data-parallel gradient all-reduce in buckets: ranges of the flat gradient buffer,
/// counted from its end (backward finishes the last layers first), each started as a
/// non-blocking all-reduce (sum) as soon as backward has finished every gradient in it.
/// Open MPI makes no asynchronous progress: an all-reduce advances only inside MPI calls
/// on its rank. Where the communicator allows it (concurrent_progress(): MPI_THREAD_MULTIPLE)
/// a progress thread polls the buckets in flight while backward computes; otherwise
/// backward's ready() calls poll them between layers. wait_all() then completes what is
/// left, under the communicator's deadline.
///
/// Gradients on a CUDA device: a device-memory communicator (NCCL) sums them in place,
/// its collectives ordered after the backward's kernels by the stream events of the NCCL
/// back end. A host-memory communicator (MPI) gets each bucket staged through a host
/// copy: copied down when it starts, summed there, copied back by wait_all().
///
/// Ranks on one node (parallel.backend shm): the gradients live in a comm::SharedSum's
/// shared-memory buffer and each bucket is summed there in place, by the same progress
/// thread (or polls) that drives MPI's all-reduce.
///
/// ZeRO (parallel.zero_stage >= 1, MPI back end): each bucket is reduce-scattered over the
/// data ranks' shards (train::ZeroShards) instead of all-reduced, started and polled alike;
/// afterwards only this rank's shard of the buffer holds sums. Stage 2 also returns the
/// pages of each bucket outside the shard to the system as soon as its reduce-scatter
/// has completed (release_outside_shard), and clear() zeroes the buffer by returning its
/// pages rather than writing them, so the gradients outside the shard are resident only
/// while backward writes them and their bucket is in flight.

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/shared_sum.hpp"
#include "tensor/context.hpp"
#include "tensor/tensor.hpp"
#include "train/zero_shards.hpp"

namespace dst::train {

class GradBuckets {
 public:
  /// `grads` (elements) is the flat buffer; buckets of at most bucket_bytes each.
  /// `overlap` false: nothing starts before wait_all() (for measuring what overlap saves).
  /// `ctx`: the back end whose memory holds `grads` (and whose stream computes them).
  /// `stage_through_host`: stage even where it is not needed (host gradients), which is
  /// how the CPU tests exercise the staged path a GPU run with MPI takes.
  GradBuckets(comm::Communicator& data, float* grads, std::size_t elements, double bucket_bytes,
              bool overlap, tensor::ExecContext ctx = {}, bool stage_through_host = false);
  /// The gradients are `shared.local()` (host memory), summed in shared memory over
  /// `shared.group()`. Throws dst::Error if `shared` has fewer slots than buckets.
  GradBuckets(comm::SharedSum& shared, double bucket_bytes, bool overlap);
  /// ZeRO: host gradients `grads` (shards.elements() f32) reduce-scattered over `shards`
  /// (one per rank of `data`) bucket by bucket (Communicator::ireduce_scatter_blocks).
  /// `release_outside_shard` (stage 2): a bucket's pages outside this rank's shard are
  /// returned to the system (read back as zeros) once its reduce-scatter has completed.
  GradBuckets(comm::Communicator& data, float* grads, const ZeroShards& shards, double bucket_bytes,
              bool overlap, bool release_outside_shard);
  ~GradBuckets();
  GradBuckets(const GradBuckets&) = delete;
  GradBuckets& operator=(const GradBuckets&) = delete;

  /// Backward reports that gradients at offsets >= `offset` are final: starts every
  /// bucket lying entirely there, polls those in flight.
  void ready(std::size_t offset);
  /// Starts what has not started and waits for every bucket (deadline: the
  /// communicator's). Returns the seconds spent waiting here (exposed communication).
  /// Rethrows an error the progress thread met.
  double wait_all();
  /// Resets for the next optimizer step.
  void reset();
  /// Zeroes the whole gradient buffer (host memory) by returning its whole pages to the
  /// system (they read back as zeros and take memory again only when written) and
  /// writing zeros into the partial pages at its ends: ZeRO stage 2's zeroing, which
  /// leaves the buffer without resident pages until backward writes them. With ZeRO
  /// shards, this rank's shard is zeroed by writing (it is resident at every step's peak,
  /// and a page fault per page costs more than the write).
  void clear();
  /// [begin, end) of bucket i (i = 0 is the last range of the buffer).
  std::size_t bucket_begin(std::size_t i) const { return begins_.at(i); }
  std::size_t bucket_end(std::size_t i) const { return ends_.at(i); }

  std::size_t bucket_count() const { return begins_.size(); }
  /// The elements [begin, end) of one bucket.
  struct Range {
    std::size_t begin = 0, end = 0;
  };
  /// The buckets of a buffer of `elements` f32 at `bucket_bytes` each, as every
  /// GradBuckets lays them out: from the buffer's end (the backward finishes it first),
  /// bucket 0 the last range, the first range the remainder.
  static std::vector<Range> layout(std::size_t elements, double bucket_bytes);
  /// How many buckets a buffer of `elements` f32 makes at `bucket_bytes` each.
  static std::size_t bucket_count_for(std::size_t elements, double bucket_bytes);
  /// True when a progress thread polls the buckets in flight (overlap on a communicator
  /// that allows it).
  bool progress_thread() const { return progress_.joinable(); }
  /// True when the buckets travel through a host copy (device gradients, host-memory
  /// communicator).
  bool staged() const { return !staging_.empty(); }
  /// How many buckets of this step are known to have completed (seen by a poll of the
  /// progress thread or of ready(), or by wait_all()).
  std::size_t completed() const;
  /// After wait_all(): the first non-finite gradient offset seen in a bucket before it
  /// was sent, or -1 (each bucket is scanned just before its all-reduce, so the rank that
  /// produced a NaN can be named; on a device the scans are enqueued without waiting and
  /// their flag is read once, by wait_all(); a shared-memory sum of several ranks checks
  /// every rank's values while it adds them, scan_in_sum()).
  std::int64_t first_nonfinite_offset() const { return first_nonfinite_; }

 private:
  GradBuckets(comm::Communicator& data, float* grads, std::size_t elements, double bucket_bytes,
              bool overlap, tensor::ExecContext ctx, bool stage_through_host,
              comm::SharedSum* shared);
  /// What the constructors share once the members are set.
  void setup(std::size_t elements, double bucket_bytes, bool stage_through_host);
  void start(std::size_t i);
  /// Bucket i's collective has completed: stage 2 releases its pages outside the shard.
  /// Runs once per bucket and step, on the thread that saw the completion.
  void completed_bucket(std::size_t i);
  /// Polls bucket i (under the mutex where a progress thread runs); true when complete.
  bool poll(std::size_t i);
  /// The sums check the gradients as they add them (comm::SharedSum's scan), so start()
  /// runs no scan of its own. Not for a group of one: its "sum" reads nothing.
  bool scan_in_sum() const { return shared_ != nullptr && shared_->size() > 1; }
  tensor::Tensor flag_tensor() const;
  void progress_loop();
  comm::Communicator& comm_;
  comm::SharedSum* shared_ = nullptr;   ///< sums in shared memory instead of comm_
  const ZeroShards* shards_ = nullptr;  ///< ZeRO: reduce-scatters over these shards
  bool release_ = false;                ///< ZeRO stage 2: release_outside_shard
  tensor::ExecContext ctx_;
  float* grads_;
  std::vector<float> staging_;     ///< host copy of the gradients when staged()
  bool alone_on_device_ = false;   ///< device gradients, host communicator of one rank
  tensor::ExecContext scan_ctx_;   ///< where the scans run: ctx_, or the host if staged()
  std::uint64_t* flag_ = nullptr;  ///< kernels::first_nonfinite_min's flag, scan_ctx_'s memory
  std::vector<std::size_t> begins_,
      ends_;  ///< bucket i = [begins_[i], ends_[i]); i = 0 is the last range
  std::vector<comm::Request> requests_;
  std::vector<bool> done_;  ///< bucket i's all-reduce has completed this step
  std::size_t next_ = 0;    ///< buckets [0, next_) have been started
  bool overlap_;
  std::int64_t first_nonfinite_ = -1;
  // The progress thread polls requests_[0, next_) while polling_; the mutex guards
  // requests_, done_, next_, polling_, stop_ and progress_error_ between it and the owner.
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool polling_ = false;
  bool stop_ = false;
  std::exception_ptr progress_error_;
  std::thread progress_;
};

}  // namespace dst::train
