#include "train/loss_scaler.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.hpp"

namespace dst::train {

bool LossScaler::update(bool overflow) {
  const double before = scale_;
  if (overflow) {
    scale_ = std::max(kMinScale, scale_ * kBackoffFactor);
    clean_steps_ = 0;
  } else if (++clean_steps_ >= kGrowthInterval) {
    scale_ = std::min(kMaxScale, scale_ * kGrowthFactor);
    clean_steps_ = 0;
  }
  return scale_ != before;
}

void LossScaler::set_state(double scale, std::int64_t clean_steps) {
  if (!std::isfinite(scale) || scale < kMinScale || scale > kMaxScale)
    throw Error("loss scaler: restored scale must be in [" + std::to_string(kMinScale) + ", " +
                std::to_string(kMaxScale) + "], got " + std::to_string(scale));
  if (clean_steps < 0)
    throw Error("loss scaler: restored clean-step count must be >= 0, got " +
                std::to_string(clean_steps));
  scale_ = scale;
  clean_steps_ = clean_steps;
}

}  // namespace dst::train
