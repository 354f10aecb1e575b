#pragma once
/// \file schedule.hpp
/// The learning-rate schedule: a pure function of the deck's training section, the
/// optimizer step and the world size, so a resumed run (or any rank) recomputes it exactly.
///
/// With peak = optimizer.lr x world-size factor, W = warmup_steps, S = max_steps,
/// floor = min_lr_ratio x peak and s the 0-based step:
///   warm-up (every type), s < W:  peak * (s + 1) / W
///     (the first step already trains, at peak / W; step W - 1 reaches the peak; llm.c
///      and Megatron-LM's ramp, rather than one step spent at lr 0)
///   then, for s >= W:
///   constant:      peak
///   cosine:        floor + (peak - floor) * (1 + cos(pi * p)) / 2
///   linear:        floor + (peak - floor) * (1 - p)
///       with p = (s - W) / (S - W) clamped to [0, 1] (p = 1 when S <= W): the peak at
///       step W, the floor at step S, so the last step (S - 1) is one step above it;
///       steps past S stay at the floor
///   inverse_sqrt:  max(floor, peak * sqrt(max(W, 1) / (s + 1)))
///       (Vaswani et al. 2017's rsqrt decay, continuous with the warm-up: peak at step
///        W - 1; with W = 0 it is peak / sqrt(s + 1))
///   multistep:     peak * factors[i] for the last milestone i with s >= M_i, else peak,
///       M_i = milestones[i] * S rounded up to an integer step (DeepSeek-LLM, Bi et al.
///       2024, sec. 2.3: 31.6% of the peak after 80% of training, 10% after 90%)
///
/// World-size scaling of the peak: none (1), linear (world / reference_world_size) or
/// sqrt (sqrt(world / reference_world_size)): the linear scaling rule of Goyal et al.
/// 2017 and its square-root variant for adaptive optimizers.

#include <cstdint>

#include "config/run_config.hpp"

namespace dst::train {

/// The learning rate of the optimizer step `step` (0-based global step) on `world_size`
/// ranks. Throws dst::Error for step < 0, world_size < 1, an unknown schedule type or
/// world_size_scaling, or multistep milestones and factors of different lengths.
double learning_rate(const config::TrainingSection& training, std::int64_t step, int world_size);

/// The peak learning rate after world-size scaling (the value warm-up reaches).
double peak_learning_rate(const config::TrainingSection& training, int world_size);

/// The first step at which multistep's milestone `fraction` applies: ceil(fraction * S),
/// where a product within 1e-9 (relative) of an integer counts as that integer, so a
/// decimal fraction in the deck (0.07 of 100 steps) means step 7 although 0.07 * 100
/// = 7.000000000000001 in double.
std::int64_t milestone_step(double fraction, std::int64_t max_steps);

}  // namespace dst::train
