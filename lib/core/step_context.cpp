#include "core/step_context.hpp"

#include <atomic>

namespace dst::core {

namespace {
std::atomic<std::int64_t> g_step{kStartupStep};
}

void set_current_step(std::int64_t step) {
  g_step.store(step, std::memory_order_relaxed);
}

std::int64_t current_step() {
  return g_step.load(std::memory_order_relaxed);
}

std::string describe_current_step() {
  const auto s = current_step();
  return s == kStartupStep ? std::string("start-up") : "step " + std::to_string(s);
}

}  // namespace dst::core
