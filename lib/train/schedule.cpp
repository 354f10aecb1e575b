#include "train/schedule.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.hpp"

namespace dst::train {
namespace {
// C++17 has no std::numbers::pi.
constexpr double kPi = 3.14159265358979323846;
}  // namespace

double peak_learning_rate(const config::TrainingSection& training, int world_size) {
  const auto& sched = training.schedule;
  if (world_size < 1)
    throw Error("train::learning_rate: world_size must be >= 1, got " + std::to_string(world_size));
  if (sched.reference_world_size < 1)
    throw Error("train::learning_rate: training.schedule.reference_world_size must be >= 1, got " +
                std::to_string(sched.reference_world_size));
  const double ratio =
      static_cast<double>(world_size) / static_cast<double>(sched.reference_world_size);
  const double lr = training.optimizer.lr;
  switch (sched.world_size_scaling) {
    case config::WorldSizeScaling::none:
      return lr;
    case config::WorldSizeScaling::linear:
      return lr * ratio;
    case config::WorldSizeScaling::sqrt:
      return lr * std::sqrt(ratio);
  }
  throw Error("train::learning_rate: training.schedule.world_size_scaling holds no known value (" +
              std::to_string(static_cast<int>(sched.world_size_scaling)) + ")");
}

std::int64_t milestone_step(double fraction, std::int64_t max_steps) {
  const double x = fraction * static_cast<double>(max_steps);
  const double nearest = std::round(x);
  if (std::fabs(x - nearest) <= 1e-9 * std::max(1.0, std::fabs(x)))
    return static_cast<std::int64_t>(nearest);
  return static_cast<std::int64_t>(std::ceil(x));
}

double learning_rate(const config::TrainingSection& training, std::int64_t step, int world_size) {
  const auto& sched = training.schedule;
  if (step < 0)
    throw Error("train::learning_rate: step is 0-based and must be >= 0, got " +
                std::to_string(step));
  const double peak = peak_learning_rate(training, world_size);
  const std::int64_t warmup = sched.warmup_steps;
  const std::int64_t max_steps = training.max_steps;
  using config::ScheduleType;
  const ScheduleType type = sched.type;
  if (type == ScheduleType::multistep && sched.milestones.size() != sched.factors.size())
    throw Error("train::learning_rate: training.schedule.milestones has " +
                std::to_string(sched.milestones.size()) + " entries but factors has " +
                std::to_string(sched.factors.size()));

  if (step < warmup) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup);

  const double floor = sched.min_lr_ratio * peak;
  if (type == ScheduleType::constant) return peak;
  if (type == ScheduleType::cosine || type == ScheduleType::linear) {
    const double p = max_steps <= warmup
                         ? 1.0
                         : std::min(1.0, static_cast<double>(step - warmup) /
                                             static_cast<double>(max_steps - warmup));
    const double shape = type == ScheduleType::cosine ? 0.5 * (1.0 + std::cos(kPi * p)) : 1.0 - p;
    return floor + (peak - floor) * shape;
  }
  if (type == ScheduleType::inverse_sqrt) {
    const double w = static_cast<double>(std::max<std::int64_t>(warmup, 1));
    return std::max(floor, peak * std::sqrt(w / static_cast<double>(step + 1)));
  }
  // multistep: milestones are strictly increasing (validated with the deck), so the last
  // one passed decides.
  double factor = 1.0;
  for (std::size_t i = 0; i < sched.milestones.size(); ++i)
    if (step >= milestone_step(sched.milestones[i], max_steps)) factor = sched.factors[i];
  return peak * factor;
}

}  // namespace dst::train
