#include "train/grad_buckets.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/error.hpp"

namespace dst::train {

GradBuckets::GradBuckets(comm::Communicator& data, float* grads, std::size_t elements,
                         double bucket_bytes, bool overlap)
    : comm_(data), grads_(grads), overlap_(overlap) {
  const auto per = std::max<std::size_t>(1, static_cast<std::size_t>(bucket_bytes / sizeof(float)));
  for (std::size_t end = elements; end > 0;) {
    const std::size_t begin = end > per ? end - per : 0;
    begins_.push_back(begin);
    ends_.push_back(end);
    end = begin;
  }
  requests_.resize(begins_.size());
  started_.assign(begins_.size(), false);
}

void GradBuckets::start(std::size_t i) {
  const float* p = grads_ + begins_[i];
  const std::size_t n = ends_[i] - begins_[i];
  if (first_nonfinite_ < 0) {
    // Scan before sending: after the sum every rank sees the NaN, but only now is it
    // known which rank's own gradient had it.
    for (std::size_t j = 0; j < n; ++j) {
      if (!std::isfinite(p[j])) {
        first_nonfinite_ = static_cast<std::int64_t>(begins_[i] + j);
        break;
      }
    }
  }
  requests_[i] = comm_.iallreduce(grads_ + begins_[i], n, DType::f32, comm::ReduceOp::sum);
  started_[i] = true;
}

void GradBuckets::ready(std::size_t offset) {
  if (!overlap_) return;
  while (next_ < begins_.size() && begins_[next_] >= offset)
    start(next_++);
  for (std::size_t i = 0; i < next_; ++i)
    if (requests_[i].valid()) requests_[i].test();  // drives Open MPI's progress
}

double GradBuckets::wait_all() {
  const auto t0 = std::chrono::steady_clock::now();
  while (next_ < begins_.size())
    start(next_++);
  for (auto& r : requests_)
    if (r.valid()) r.wait();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void GradBuckets::reset() {
  next_ = 0;
  first_nonfinite_ = -1;
  std::fill(started_.begin(), started_.end(), false);
}

}  // namespace dst::train
