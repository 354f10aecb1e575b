#pragma once
/// \file deadline.hpp
/// A point in time after which waiting is an error.

#include <chrono>

namespace dst::core {

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;

  /// A deadline `seconds` from now; seconds <= 0 means "never".
  explicit Deadline(double seconds)
      : never_(seconds <= 0.0),
        limit_s_(seconds),
        start_(Clock::now()),
        end_(start_ + std::chrono::duration_cast<Clock::duration>(
                          std::chrono::duration<double>(never_ ? 0.0 : seconds))) {}

  bool expired() const { return !never_ && Clock::now() >= end_; }
  double elapsed_s() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  double limit_s() const { return limit_s_; }

 private:
  bool never_;
  double limit_s_;
  Clock::time_point start_;
  Clock::time_point end_;
};

}  // namespace dst::core
