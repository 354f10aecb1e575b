#include "train/grad_buckets.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include <sys/mman.h>
#include <unistd.h>

#include "core/error.hpp"
#include "kernels/kernels.hpp"
#include "tensor/memory.hpp"

namespace dst::train {

namespace {
constexpr int kMpiPollUs = 50;      ///< progress thread's sleep between polls of MPI requests
constexpr int kSharedPollUs = 500;  ///< ... of shared-memory sums (see progress_loop)

std::size_t per_bucket(double bucket_bytes) {
  return std::max<std::size_t>(1, static_cast<std::size_t>(bucket_bytes / sizeof(float)));
}

/// Returns the whole pages of host memory [p, p + n) to the system: a private anonymous
/// mapping's page reads back as zeros and takes memory again when written. The partial
/// pages at the ends keep their contents (`zero_ends`: are zeroed).
void release_pages(float* p, std::size_t n, bool zero_ends) {
  if (n == 0) return;
  static const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t end = begin + n * sizeof(float);
  const std::uintptr_t a = (begin + page - 1) / page * page, b = end / page * page;
  if (a >= b) {
    if (zero_ends) std::fill(p, p + n, 0.0f);
    return;
  }
  if (::madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED) != 0)
    throw Error("train: returning " + std::to_string(b - a) +
                " bytes of gradient memory to the system (madvise) failed");
  if (zero_ends) {
    std::fill(p, reinterpret_cast<float*>(a), 0.0f);
    std::fill(reinterpret_cast<float*>(b), p + n, 0.0f);
  }
}
}  // namespace

std::vector<GradBuckets::Range> GradBuckets::layout(std::size_t elements, double bucket_bytes) {
  const std::size_t per = per_bucket(bucket_bytes);
  std::vector<Range> out;
  for (std::size_t end = elements; end > 0;) {
    const std::size_t begin = end > per ? end - per : 0;
    out.push_back({begin, end});
    end = begin;
  }
  return out;
}

std::size_t GradBuckets::bucket_count_for(std::size_t elements, double bucket_bytes) {
  const std::size_t per = per_bucket(bucket_bytes);
  return (elements + per - 1) / per;
}

GradBuckets::GradBuckets(comm::Communicator& data, float* grads, std::size_t elements,
                         double bucket_bytes, bool overlap, tensor::ExecContext ctx,
                         bool stage_through_host)
    : GradBuckets(data, grads, elements, bucket_bytes, overlap, ctx, stage_through_host, nullptr) {}

GradBuckets::GradBuckets(comm::SharedSum& shared, double bucket_bytes, bool overlap)
    : GradBuckets(shared.group(), shared.local(), shared.elements(), bucket_bytes, overlap, {},
                  false, &shared) {}

GradBuckets::GradBuckets(comm::Communicator& data, float* grads, const ZeroShards& shards,
                         double bucket_bytes, bool overlap, bool release_outside_shard)
    : comm_(data),
      shards_(&shards),
      release_(release_outside_shard),
      grads_(grads),
      overlap_(overlap) {
  if (shards.ranks() != data.size())
    throw Error("train: " + std::to_string(shards.ranks()) + " ZeRO shards for the " +
                std::to_string(data.size()) + " ranks of group '" + data.name() + "'");
  setup(shards.elements(), bucket_bytes, false);
}

GradBuckets::GradBuckets(comm::Communicator& data, float* grads, std::size_t elements,
                         double bucket_bytes, bool overlap, tensor::ExecContext ctx,
                         bool stage_through_host, comm::SharedSum* shared)
    : comm_(data), shared_(shared), ctx_(ctx), grads_(grads), overlap_(overlap) {
  setup(elements, bucket_bytes, stage_through_host);
}

void GradBuckets::setup(std::size_t elements, double bucket_bytes, bool stage_through_host) {
  if (shared_ && shared_->slots() < bucket_count_for(elements, bucket_bytes))
    throw Error("train: " + std::to_string(bucket_count_for(elements, bucket_bytes)) +
                " gradient buckets but the shared-memory buffers of group '" + comm_.name() +
                "' have " + std::to_string(shared_->slots()) + " slots");
  const bool device_on_host_comm =
      tensor::device_of(ctx_) != tensor::Device::host && !comm_.device_memory();
  // Alone in the group there is nothing to sum: device gradients stay where they are
  // (no copy of the whole buffer down and up every step); only the scan runs.
  alone_on_device_ = device_on_host_comm && comm_.size() == 1 && !stage_through_host;
  if (stage_through_host || (device_on_host_comm && !alone_on_device_))
    staging_.assign(elements, 0.0f);
  // The non-finite scans read what is sent: the staged host copy, or the gradients.
  scan_ctx_ = staged() ? tensor::ExecContext{} : ctx_;
  flag_ = static_cast<std::uint64_t*>(tensor::allocate(
      tensor::device_of(scan_ctx_), sizeof(std::uint64_t), scan_ctx_.stream, "gradient scan flag"));
  reset();
  for (const Range& r : layout(elements, bucket_bytes)) {
    begins_.push_back(r.begin);
    ends_.push_back(r.end);
  }
  requests_.resize(begins_.size());
  done_.assign(begins_.size(), false);
  // A shared-memory sum's polls touch only its own counters and buffers: any thread may
  // make them, whatever MPI's thread level.
  if (overlap_ && comm_.size() > 1 && (shared_ || comm_.concurrent_progress()))
    progress_ = std::thread([this] { progress_loop(); });
}

GradBuckets::~GradBuckets() {
  tensor::release(tensor::device_of(scan_ctx_), flag_, scan_ctx_.stream);
  if (!progress_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_one();
  progress_.join();
}

// Polls the started buckets until wait_all() takes over. Each MPI_Test moves the
// all-reduce a few shared-memory fragments on; between polls the thread sleeps, so it
// costs the computing thread little (a poll is a few microseconds; 50 us is about the
// shortest sleep Linux's default timer slack gives). A shared-memory sum needs far fewer
// polls: one adds this rank's whole part of a bucket once every rank has started it, so
// the thread wakes every 500 us, a tenth as often (no slower in small's steps at 2 ranks,
// where a thread-less variant, polling only in ready(), was not faster either:
// docs/measurements/gradient-communication.md).
void GradBuckets::progress_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait(lock, [this] { return stop_ || polling_; });
    if (stop_) return;
    bool pending = false;
    try {
      for (std::size_t i = 0; i < next_; ++i)
        pending = !poll(i) || pending;
    } catch (...) {
      progress_error_ = std::current_exception();
      polling_ = false;
      continue;
    }
    // Nothing left in flight: sleep until ready() starts more (or wait_all()).
    if (!pending) {
      polling_ = false;
      continue;
    }
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(shared_ ? kSharedPollUs : kMpiPollUs));
    lock.lock();
  }
}

void GradBuckets::start(std::size_t i) {
  const std::size_t n = ends_[i] - begins_[i];
  // What the communicator sums: the gradients themselves, or their host copy (taken
  // now: the copy waits for the backward's kernels on the compute stream).
  float* buf = grads_ + begins_[i];
  if (staged()) {
    tensor::copy(ctx_, staging_.data() + begins_[i], buf, n * sizeof(float));
    buf = staging_.data() + begins_[i];
  }
  // Scan before sending: after the sum every rank sees the NaN, but only now is it known
  // which rank's own gradient had it. Enqueued only (no wait for a device's answer):
  // wait_all() reads the flag once. A shared-memory sum of several ranks checks every
  // rank's values as it adds them instead (scan_in_sum()): no pass of its own.
  if (!scan_in_sum()) {
    tensor::Tensor range{buf, {static_cast<std::int64_t>(n)}};
    range.device = tensor::device_of(scan_ctx_);
    kernels::first_nonfinite_min(scan_ctx_, range, begins_[i], flag_tensor());
  }
  if (alone_on_device_) return;  // a host communicator must not see device memory
  if (shards_)
    requests_[i] = comm_.ireduce_scatter_blocks(buf, shards_->counts(begins_[i], ends_[i]),
                                                DType::f32, comm::ReduceOp::sum);
  else
    requests_[i] = shared_ ? shared_->isum(i, begins_[i], n, 0, scan_in_sum())
                           : comm_.iallreduce(buf, n, DType::f32, comm::ReduceOp::sum);
}

bool GradBuckets::poll(std::size_t i) {
  if (!done_[i] && requests_[i].test()) {
    done_[i] = true;
    completed_bucket(i);
  }
  return done_[i];
}

void GradBuckets::completed_bucket(std::size_t i) {
  if (!release_) return;
  // Outside the shard: what lies before it and after it in the bucket.
  const std::size_t first = shards_->first(comm_.rank()), last = shards_->last(comm_.rank());
  const std::size_t b = begins_[i], e = ends_[i];
  if (b < std::min(e, first)) release_pages(grads_ + b, std::min(e, first) - b, false);
  if (std::max(b, last) < e)
    release_pages(grads_ + std::max(b, last), e - std::max(b, last), false);
}

void GradBuckets::clear() {
  const std::size_t n = begins_.empty() ? 0 : ends_.front();
  if (!shards_) {
    release_pages(grads_, n, true);
    return;
  }
  // The shard's pages are resident at every step's peak anyway: zeroed in place, not
  // faulted in again; the rest returned.
  const std::size_t first = shards_->first(comm_.rank()), last = shards_->last(comm_.rank());
  release_pages(grads_, first, true);
  std::fill(grads_ + first, grads_ + last, 0.0f);
  release_pages(grads_ + last, n - last, true);
}

void GradBuckets::ready(std::size_t offset) {
  if (!overlap_) return;
  if (progress_.joinable()) {
    bool started = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      while (next_ < begins_.size() && begins_[next_] >= offset) {
        start(next_++);
        started = true;
      }
      if (started) polling_ = true;
    }
    if (started) wake_.notify_one();
    return;
  }
  while (next_ < begins_.size() && begins_[next_] >= offset)
    start(next_++);
  for (std::size_t i = 0; i < next_; ++i)
    poll(i);  // drives Open MPI's progress
}

std::size_t GradBuckets::completed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<std::size_t>(std::count(done_.begin(), done_.end(), true));
}

double GradBuckets::wait_all() {
  const auto t0 = std::chrono::steady_clock::now();
  {
    // The progress thread stops polling (it holds the lock for the length of one pass);
    // from here the owner alone touches the requests.
    std::lock_guard<std::mutex> lock(mutex_);
    polling_ = false;
    if (progress_error_) std::rethrow_exception(std::exchange(progress_error_, nullptr));
  }
  while (next_ < begins_.size())
    start(next_++);
  for (std::size_t i = 0; i < requests_.size(); ++i) {
    if (requests_[i].valid()) requests_[i].wait();  // immediate where a poll saw it done
    if (!done_[i]) {
      done_[i] = true;
      completed_bucket(i);
    }
  }
  // The buckets cover the buffer: one copy brings every sum back to the device.
  if (staged()) tensor::copy(ctx_, grads_, staging_.data(), staging_.size() * sizeof(float));
  if (scan_in_sum()) {
    first_nonfinite_ = shared_->first_nonfinite();  // every sum is complete
  } else {
    std::uint64_t first = 0;
    tensor::copy(scan_ctx_, &first, flag_, sizeof first);
    first_nonfinite_ =
        first == std::numeric_limits<std::uint64_t>::max() ? -1 : static_cast<std::int64_t>(first);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

tensor::Tensor GradBuckets::flag_tensor() const {
  tensor::Tensor t{flag_, {1}, DType::u64};
  t.device = tensor::device_of(scan_ctx_);
  return t;
}

void GradBuckets::reset() {
  next_ = 0;
  first_nonfinite_ = -1;
  const std::uint64_t none = std::numeric_limits<std::uint64_t>::max();
  tensor::copy(scan_ctx_, flag_, &none, sizeof none);
  if (scan_in_sum()) shared_->reset_nonfinite();  // before this step's first sum starts
  std::fill(done_.begin(), done_.end(), false);
}

}  // namespace dst::train
