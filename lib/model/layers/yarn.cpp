#include "model/layers/yarn.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"

namespace dst::model::yarn {

namespace {
constexpr double kPi = 3.14159265358979323846;

double mscale_of(double s, double m) {
  return s <= 1.0 ? 1.0 : 0.1 * m * std::log(s) + 1.0;
}

/// The dim whose wavelength makes `rotations` turns over `context` positions.
double correction_dim(double rotations, double dim, double theta, double context) {
  return dim * std::log(context / (rotations * 2.0 * kPi)) / (2.0 * std::log(theta));
}
}  // namespace

std::vector<double> inv_freq(std::int64_t dim, double theta, const config::RopeScalingSection& r) {
  if (dim < 2 || dim % 2 != 0)
    throw Error("yarn: the RoPE width must be even and >= 2, got " + std::to_string(dim));
  const double d = static_cast<double>(dim);
  const double context = static_cast<double>(r.original_max_seq_len);
  const double low = std::max(std::floor(correction_dim(r.beta_fast, d, theta, context)), 0.0);
  double high = std::min(std::ceil(correction_dim(r.beta_slow, d, theta, context)), d - 1.0);
  if (high == low) high += 0.001;  // transformers' guard against a zero-width ramp
  std::vector<double> out(static_cast<std::size_t>(dim / 2));
  for (std::int64_t i = 0; i < dim / 2; ++i) {
    const double pos_freq = std::pow(theta, 2.0 * static_cast<double>(i) / d);
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    out[static_cast<std::size_t>(i)] = ramp / (r.factor * pos_freq) + (1.0 - ramp) / pos_freq;
  }
  return out;
}

double table_factor(const config::RopeScalingSection& r) {
  if (r.mscale != 0.0 && r.mscale_all_dim != 0.0)
    return mscale_of(r.factor, r.mscale) / mscale_of(r.factor, r.mscale_all_dim);
  return mscale_of(r.factor, 1.0);
}

double softmax_factor(const config::RopeScalingSection& r) {
  if (r.mscale_all_dim == 0.0) return 1.0;
  const double m = mscale_of(r.factor, r.mscale_all_dim);
  return m * m;
}

}  // namespace dst::model::yarn
