#include "comm/shared_sum.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>
#include <sstream>
#include <string>

#include "comm/mpi_communicator.hpp"
#include "comm/op_info.hpp"
#include "core/bulk_memory.hpp"
#include "core/deadline.hpp"
#include "core/error.hpp"
#include "core/flight_recorder.hpp"
#include "core/log.hpp"
#include "core/poll_policy.hpp"
#include "core/step_context.hpp"
#include "runtime/mpi_check.hpp"

namespace dst::comm {

namespace {

// The counters are plain memory shared between processes: only an always-lock-free
// atomic is address-free (the same object seen through two mappings is one atomic).
static_assert(std::atomic<std::uint64_t>::is_always_lock_free,
              "shared-memory counters need lock-free 64-bit atomics");

constexpr std::size_t kLine = 64;                           ///< bytes of a cache line (x86-64, Arm)
constexpr std::size_t kLineFloats = kLine / sizeof(float);  ///< f32 per line
constexpr std::size_t kPage = 4096;
constexpr std::uint64_t kNoNonfinite = UINT64_MAX;    ///< a rank's first non-finite: none
constexpr std::uint32_t kExponentBits = 0x7f800000u;  ///< of an f32: all ones = NaN or inf

std::size_t round_up(std::size_t n, std::size_t to) {
  return (n + to - 1) / to * to;
}

}  // namespace

/// One started sum or gather. Does this rank's part once every rank has marked the range
/// ready, and completes once every rank has done its part.
class SharedSum::Op final : public Request::Impl {
 public:
  Op(SharedSum& sum, Kind kind, std::size_t slot, std::size_t begin, std::size_t count,
     std::size_t buffer, bool scan, std::uint64_t use, double timeout_s)
      : sum_(sum),
        kind_(kind),
        slot_(slot),
        begin_(begin),
        count_(count),
        buffer_(buffer),
        scan_(scan),
        use_(use),
        timeout_s_(timeout_s),
        seq_(core::FlightRecorder::instance().begin(describe())) {}

  bool test() override {
    if (!added_) {
      for (int q = 0; q < sum_.size_; ++q)
        if (sum_.ready(q, slot_).load(std::memory_order_acquire) < use_) return false;
      if (kind_ == Kind::sum)
        sum_.add_my_part(begin_, count_, buffer_, scan_);
      else
        sum_.copy_my_part(begin_, count_, buffer_);
      sum_.done(sum_.rank_, slot_).store(use_, std::memory_order_release);
      added_ = true;
    }
    for (int q = 0; q < sum_.size_; ++q)
      if (sum_.done(q, slot_).load(std::memory_order_acquire) < use_) return false;
    if (!recorded_done_) {
      core::FlightRecorder::instance().end(seq_);
      sum_.completed_[slot_] = use_;
    }
    recorded_done_ = true;
    return true;
  }

  void wait() override { wait_for(timeout_s_); }

  // Polls as every collective wait does (core::PollPolicy::collective()): yielding for
  // the first second (a peer's backward is usually about to finish), then short sleeps.
  void wait_for(double timeout_s) override {
    const core::Deadline deadline(timeout_s);
    if (!core::poll_until([this] { return test(); }, deadline, core::PollPolicy::collective()))
      throw TimeoutError(timeout_message(deadline.limit_s()));
  }

  std::string describe() const override {
    std::string what;
    if (kind_ == Kind::sum) {
      OpInfo info{OpKind::allreduce, ReduceOp::sum, count_, DType::f32, 0};
      what = describe_op("shm", info, sum_.group_.name(), sum_.size_);
    } else {
      what = "shm: allgather in place of " + std::to_string(count_) + " x f32 (" +
             std::to_string(count_ * sizeof(float)) + " B, one part per rank) on group '" +
             sum_.group_.name() + "' (" + std::to_string(sum_.size_) + " ranks)";
    }
    return what + ", elements [" + std::to_string(begin_) + ", " + std::to_string(begin_ + count_) +
           ") of buffer " + std::to_string(buffer_) + ", slot " + std::to_string(slot_);
  }

 private:
  std::string timeout_message(double limit_s) const {
    std::ostringstream os;
    os << describe() << " did not complete within " << limit_s << " s at "
       << core::describe_current_step() << " (rank " << sum_.rank_ << " waited;";
    const auto list = [&](const char* what, auto&& late) {
      std::string ranks;
      for (int q = 0; q < sum_.size_; ++q)
        if (late(q)) ranks += (ranks.empty() ? "" : ", ") + std::to_string(q);
      if (!ranks.empty()) os << " " << what << ": " << ranks << ";";
    };
    list("not started by rank(s)",
         [&](int q) { return sum_.ready(q, slot_).load(std::memory_order_acquire) < use_; });
    list(kind_ == Kind::sum ? "started, part not yet added by rank(s)"
                            : "started, part not yet copied by rank(s)",
         [&](int q) {
           return sum_.ready(q, slot_).load(std::memory_order_acquire) >= use_ &&
                  sum_.done(q, slot_).load(std::memory_order_acquire) < use_;
         });
    os << " a peer is missing, hung or slower than the deadline)\n"
       << "recent operations on rank " << sum_.rank_ << " (flight recorder, oldest first):\n"
       << core::FlightRecorder::instance().report();
    return os.str();
  }

  SharedSum& sum_;
  Kind kind_;
  std::size_t slot_, begin_, count_, buffer_;
  bool scan_;
  std::uint64_t use_;
  double timeout_s_;
  std::uint64_t seq_;  ///< in the flight recorder
  bool added_ = false;
  bool recorded_done_ = false;
};

SharedSum::SharedSum(Communicator& group, std::size_t elements, std::size_t slots,
                     std::size_t buffers)
    : group_(group),
      elements_(elements),
      slots_(slots),
      buffers_(buffers),
      rank_(group.rank()),
      size_(group.size()),
      uses_(slots, 0),
      completed_(slots, 0),
      uncaught_at_start_(std::uncaught_exceptions()) {
  const std::string what = "comm: shared-memory buffers of group '" + group.name() + "'";
  if (buffers_ == 0) throw Error(what + ": at least one buffer per rank is needed");
  // Every rank is here (or the deadline names the one that is not) before the blocking
  // MPI calls below, which have no deadline of their own.
  group_.barrier();
  const MPI_Comm comm = mpi_comm_of(group_);
  DST_MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node_));
  int node_size = 0;
  DST_MPI_CHECK(MPI_Comm_size(node_, &node_size));
  const int everywhere = group_.allreduce_value(node_size == size_ ? 1 : 0, ReduceOp::min);
  if (everywhere == 0) {
    MPI_Comm_free(&node_);
    throw Error(what + ": its " + std::to_string(size_) +
                " ranks are not all on one node (this rank shares a node with " +
                std::to_string(node_size) + " of them); use parallel.backend mpi");
  }
  // Per rank: the counters (two cache lines per slot, one for the first non-finite
  // element), then the buffers, whole pages each.
  const std::size_t flag_bytes = round_up((slots_ * 2 + 1) * kLine, kPage);
  const std::size_t buffer_bytes = round_up(elements_ * sizeof(float), kPage);
  // One line more: Open MPI does not promise aligned segments. Every mapping of a
  // segment starts on a page, so its offset within a line is the same in every process.
  const std::size_t bytes = kLine + flag_bytes + buffers_ * buffer_bytes;
  MPI_Info info = MPI_INFO_NULL;
  DST_MPI_CHECK(MPI_Info_create(&info));
  // Each rank's segment on its own pages (first touched by its owner, so on its NUMA node).
  DST_MPI_CHECK(MPI_Info_set(info, "alloc_shared_noncontig", "true"));
  void* mine = nullptr;
  const int rc =
      MPI_Win_allocate_shared(static_cast<MPI_Aint>(bytes), 1, info, node_, &mine, &window_);
  MPI_Info_free(&info);
  if (rc != MPI_SUCCESS) {
    MPI_Comm_free(&node_);
    throw Error(what + ": MPI_Win_allocate_shared of " + std::to_string(bytes) +
                " B per rank failed (is /dev/shm large enough?)");
  }
  segments_.resize(static_cast<std::size_t>(size_) * buffers_);
  flags_.resize(static_cast<std::size_t>(size_));
  for (int q = 0; q < size_; ++q) {
    MPI_Aint size = 0;
    int unit = 0;
    void* base = nullptr;
    DST_MPI_CHECK(MPI_Win_shared_query(window_, q, &size, &unit, &base));
    auto* aligned =
        reinterpret_cast<unsigned char*>(round_up(reinterpret_cast<std::uintptr_t>(base), kLine));
    flags_[static_cast<std::size_t>(q)] = aligned;
    for (std::size_t b = 0; b < buffers_; ++b)
      segments_[static_cast<std::size_t>(q) * buffers_ + b] =
          reinterpret_cast<float*>(aligned + flag_bytes + b * buffer_bytes);
  }
  for (std::size_t s = 0; s < slots_; ++s) {
    new (&ready(rank_, s)) std::atomic<std::uint64_t>(0);
    new (&done(rank_, s)) std::atomic<std::uint64_t>(0);
  }
  new (&nonfinite(rank_)) std::atomic<std::uint64_t>(kNoNonfinite);
  for (std::size_t b = 0; b < buffers_; ++b)
    std::memset(local(b), 0, elements_ * sizeof(float));
  // The peers read these counters from now on: they must see them initialised.
  group_.barrier();
}

SharedSum::~SharedSum() {
  if (window_ == MPI_WIN_NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (std::uncaught_exceptions() > uncaught_at_start_) return;  // see the header
  try {
    // No peer may still be reading this rank's buffer, and MPI_Win_free must not wait
    // for a rank that never comes.
    group_.barrier();
    DST_MPI_CHECK(MPI_Win_free(&window_));
    DST_MPI_CHECK(MPI_Comm_free(&node_));
  } catch (const std::exception& e) {
    log::error(std::string("comm: freeing the shared-memory buffers of group '") + group_.name() +
               "': " + e.what());
  }
}

std::atomic<std::uint64_t>& SharedSum::ready(int rank, std::size_t slot) const {
  return *reinterpret_cast<std::atomic<std::uint64_t>*>(flags_[static_cast<std::size_t>(rank)] +
                                                        (2 * slot) * kLine);
}

std::atomic<std::uint64_t>& SharedSum::done(int rank, std::size_t slot) const {
  return *reinterpret_cast<std::atomic<std::uint64_t>*>(flags_[static_cast<std::size_t>(rank)] +
                                                        (2 * slot + 1) * kLine);
}

std::atomic<std::uint64_t>& SharedSum::nonfinite(int rank) const {
  return *reinterpret_cast<std::atomic<std::uint64_t>*>(flags_[static_cast<std::size_t>(rank)] +
                                                        (2 * slots_) * kLine);
}

std::int64_t SharedSum::first_nonfinite() const {
  const std::uint64_t first = nonfinite(rank_).load(std::memory_order_acquire);
  return first == kNoNonfinite ? -1 : static_cast<std::int64_t>(first);
}

void SharedSum::reset_nonfinite() {
  nonfinite(rank_).store(kNoNonfinite, std::memory_order_release);
}

void SharedSum::part_of(std::size_t count, int ranks, int r, std::size_t& first,
                        std::size_t& last) {
  const std::size_t per = round_up(
      (count + static_cast<std::size_t>(ranks) - 1) / static_cast<std::size_t>(ranks), kLineFloats);
  first = std::min(count, static_cast<std::size_t>(r) * per);
  last = std::min(count, first + per);
}

Request SharedSum::isum(std::size_t slot, std::size_t begin, std::size_t count, std::size_t buffer,
                        bool scan) {
  return start(Kind::sum, slot, begin, count, buffer, scan);
}

Request SharedSum::igather(std::size_t slot, std::size_t begin, std::size_t count,
                           std::size_t buffer) {
  return start(Kind::gather, slot, begin, count, buffer, false);
}

Request SharedSum::start(Kind kind, std::size_t slot, std::size_t begin, std::size_t count,
                         std::size_t buffer, bool scan) {
  const char* op = kind == Kind::sum ? "sum" : "gather";
  if (slot >= slots_ || buffer >= buffers_ || begin > elements_ || count > elements_ - begin)
    throw Error(std::string("comm: shared-memory ") + op + " of elements [" +
                std::to_string(begin) + ", " + std::to_string(begin + count) + ") of buffer " +
                std::to_string(buffer) + " on slot " + std::to_string(slot) + ": outside the " +
                std::to_string(elements_) + " elements, " + std::to_string(buffers_) +
                " buffers and " + std::to_string(slots_) + " slots of group '" + group_.name() +
                "'");
  if (completed_[slot] != uses_[slot])
    throw Error(std::string("comm: shared-memory ") + op + " on slot " + std::to_string(slot) +
                " of group '" + group_.name() +
                "' started while the slot's previous operation is still pending");
  const std::uint64_t use = ++uses_[slot];
  ready(rank_, slot).store(use, std::memory_order_release);
  return Request(
      std::make_unique<Op>(*this, kind, slot, begin, count, buffer, scan, use, group_.timeout_s()));
}

void SharedSum::copy_my_part(std::size_t begin, std::size_t count, std::size_t buffer) const {
  std::size_t first = 0, last = 0;
  part_of(count, size_, rank_, first, last);
  const float* mine = segment(rank_, buffer) + begin + first;
  for (int q = 0; q < size_; ++q)
    if (q != rank_)
      // The peer reads its copy in its next forward pass, long after this core's cache
      // would have kept it: a large part goes out with streaming stores.
      core::copy_bytes(segment(q, buffer) + begin + first, mine, (last - first) * sizeof(float));
}

void SharedSum::add_my_part(std::size_t begin, std::size_t count, std::size_t buffer,
                            bool scan) const {
  if (size_ == 1) return;  // the sum over one rank is its own buffer
  std::size_t first = 0, last = 0;
  part_of(count, size_, rank_, first, last);
  // Partial sums of one chunk stay in L1 while every buffer's chunk is added to them and
  // then stored into every buffer: each element is read and written once per buffer.
  constexpr std::size_t kChunk = 1024;
  float acc[kChunk];
  for (std::size_t i = begin + first; i < begin + last; i += kChunk) {
    const std::size_t n = std::min(kChunk, begin + last - i);
    for (int q = 0; q < size_; ++q) {  // rank order: the same bits on every rank
      const float* s = segment(q, buffer) + i;
      // In the same pass: the largest exponent field of rank q's values here (all ones:
      // NaN or infinity). A max reduction vectorises with the add, at no cost to this
      // memory-bound loop; the rare hit is located element by element.
      std::uint32_t exponent = 0;
      for (std::size_t j = 0; j < n; ++j) {
        std::uint32_t b;
        std::memcpy(&b, s + j, sizeof b);
        exponent = std::max(exponent, b & kExponentBits);
        acc[j] = q == 0 ? s[j] : acc[j] + s[j];
      }
      if (scan && exponent == kExponentBits) record_nonfinite(q, s, n, i);
    }
    for (int q = 0; q < size_; ++q)
      std::memcpy(segment(q, buffer) + i, acc, n * sizeof(float));
  }
}

void SharedSum::record_nonfinite(int rank, const float* values, std::size_t n,
                                 std::size_t offset) const {
  const auto finite = [](float v) {
    std::uint32_t b;
    std::memcpy(&b, &v, sizeof b);
    return (b & kExponentBits) != kExponentBits;
  };
  std::size_t j = 0;
  while (j < n && finite(values[j]))
    ++j;
  // Lower the rank's first offset to this one (another rank's adder may lower it too).
  std::atomic<std::uint64_t>& first = nonfinite(rank);
  std::uint64_t seen = first.load(std::memory_order_relaxed);
  const std::uint64_t here = offset + j;
  while (here < seen && !first.compare_exchange_weak(seen, here, std::memory_order_acq_rel)) {
  }
}

}  // namespace dst::comm
