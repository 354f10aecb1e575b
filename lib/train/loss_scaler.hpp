#pragma once
/// \file loss_scaler.hpp
/// Dynamic loss scaling for fp16 training (training.precision: fp16; docs/precision.md).
/// fp16 keeps 11 significant bits over 2^-24 .. 65504: small activation gradients underflow
/// to zero unless the loss (so every gradient) is multiplied by a large factor first. The
/// factor is found at run time, as in Micikevicius et al., "Mixed Precision Training"
/// (ICLR 2018) and PyTorch's torch.cuda.amp.GradScaler (same defaults):
///   - start at 2^16;
///   - a step whose gradients overflowed (any non-finite value on any rank) is skipped and
///     the scale is halved (never below kMinScale);
///   - after kGrowthInterval consecutive clean steps the scale doubles (never above
///     kMaxScale) and the count restarts.
/// The state (scale, clean steps since the last change) goes into checkpoints
/// (ckpt::Metadata::loss_scale, loss_scale_clean_steps), so a resumed run continues with
/// the same scale. Plain host arithmetic on every rank: all ranks see the same overflow
/// flag (reduced across the data group), so all hold the same state.

#include <cstdint>

namespace dst::train {

class LossScaler {
 public:
  static constexpr double kInitialScale = 65536.0;       ///< 2^16 (GradScaler's init_scale)
  static constexpr std::int64_t kGrowthInterval = 2000;  ///< clean steps before doubling
  static constexpr double kGrowthFactor = 2.0;
  static constexpr double kBackoffFactor = 0.5;
  /// Floor: a scale below 1 would shrink gradients, i.e. make underflow worse, and
  /// repeated overflows at scale 1 mean the model itself diverged, which halving cannot
  /// fix (the steps keep being skipped and counted, and the log says so).
  static constexpr double kMinScale = 1.0;
  /// Ceiling 2^24: far above any useful fp16 scale (gradients would have to be below
  /// 2^-24 of the largest half), and it keeps scale x loss finite in float.
  static constexpr double kMaxScale = 16777216.0;

  LossScaler() = default;

  /// The factor the loss (and so every gradient) is multiplied by in this step.
  double scale() const { return scale_; }
  /// Consecutive clean steps since the scale last changed.
  std::int64_t clean_steps() const { return clean_steps_; }

  /// After a step: `overflow` true (its gradients had a non-finite value on some rank, and
  /// it was skipped) halves the scale and restarts the count; false counts a clean step
  /// and doubles the scale when kGrowthInterval of them have accumulated. Returns true
  /// when the scale changed.
  bool update(bool overflow);

  /// For a restore: a checkpoint's state. Throws dst::Error for a scale that is not
  /// finite or outside [kMinScale, kMaxScale], or a negative count.
  void set_state(double scale, std::int64_t clean_steps);

 private:
  double scale_ = kInitialScale;
  std::int64_t clean_steps_ = 0;
};

}  // namespace dst::train
