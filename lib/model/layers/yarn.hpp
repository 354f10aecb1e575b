#pragma once
/// \file yarn.hpp
/// YaRN (Peng et al. 2023, "YaRN: Efficient Context Window Extension of Large Language
/// Models"), as DeepSeek-V2/V3's long-context checkpoints and transformers'
/// _compute_yarn_parameters / yarn_get_mscale define it, for RoPE tables of width `dim`:
///   inv_freq_i = ramp_i / (factor theta^(2i/dim)) + (1 - ramp_i) / theta^(2i/dim),
///   ramp_i = clamp((i - low) / (high - low), 0, 1) over i < dim/2, with [low, high] the
///   dims (floor / ceil, clamped to [0, dim - 1]) whose wavelengths make beta_fast and
///   beta_slow rotations over original_max_seq_len: high frequencies are kept, low ones
///   interpolated by `factor`;
///   the tables' cos and sin multiplied by table_factor() and latent attention's softmax
///   scale by softmax_factor().
/// mscale(s, m) = 0.1 m ln(s) + 1 (1 for s <= 1). The tables' factor follows transformers:
/// mscale(s, mscale) / mscale(s, mscale_all_dim) when both are non-zero, else mscale(s, 1)
/// (DeepSeek's reference divides by mscale(s, mscale_all_dim) always; the two differ only
/// when mscale_all_dim is 0 and mscale is not 1).

#include <cstdint>
#include <vector>

#include "config/run_config.hpp"

namespace dst::model::yarn {

/// The dim/2 inverse frequencies, in double.
std::vector<double> inv_freq(std::int64_t dim, double theta, const config::RopeScalingSection& r);
/// The factor on the tables' cos and sin.
double table_factor(const config::RopeScalingSection& r);
/// The factor on the attention softmax's scale: mscale(factor, mscale_all_dim)^2, 1 when
/// mscale_all_dim is 0.
double softmax_factor(const config::RopeScalingSection& r);

}  // namespace dst::model::yarn
