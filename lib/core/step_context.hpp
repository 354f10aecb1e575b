#pragma once
/// \file step_context.hpp
/// Where the run is: the current optimizer step (or start-up), so that errors and
/// timeouts raised deep in a layer can say when they happened.

#include <cstdint>
#include <string>

namespace dst::core {

/// Step value meaning "not in the training loop yet".
inline constexpr std::int64_t kStartupStep = -1;

/// Sets the optimizer step the process is working on, counted from 1 as the log prints
/// it (thread-safe).
void set_current_step(std::int64_t step);
/// The step set last; kStartupStep before training starts.
std::int64_t current_step();
/// "step 12" or "start-up".
std::string describe_current_step();

}  // namespace dst::core
