#pragma once
/// \file plan_text.hpp
/// The memory and communication plan as the fixed-format table `dstrain check` prints.

#include <cstdint>
#include <string>

#include "config/run_config.hpp"
#include "train/plan.hpp"

namespace dst::app {

/// The plan of `c` on `layout` as `check` prints it. `available_per_rank` (0 = unknown) is
/// the memory a rank may use on the device it runs on.
std::string format_plan(const config::RunConfig& c, const config::Layout& layout,
                        const train::Plan& plan, std::uint64_t available_per_rank);

}  // namespace dst::app
