#pragma once
/// \file timing.hpp
/// The clock of the checkpoint layer's IoStats.

#include <chrono>

namespace dst::ckpt::detail {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace dst::ckpt::detail
