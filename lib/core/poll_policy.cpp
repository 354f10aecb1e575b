#include "core/poll_policy.hpp"

#include <algorithm>
#include <thread>

namespace dst::core {

std::chrono::microseconds Backoff::next(double elapsed_s) {
  if (elapsed_s < policy_.busy_s) return std::chrono::microseconds(0);
  const auto nap = nap_;
  nap_ = std::min(nap_ * 2, policy_.max_nap);
  return nap;
}

void Backoff::pause(double elapsed_s) {
  const auto nap = next(elapsed_s);
  if (nap.count() == 0)
    std::this_thread::yield();
  else
    std::this_thread::sleep_for(nap);
}

}  // namespace dst::core
