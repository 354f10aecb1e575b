/// \file sampler.cpp
/// Feistel permutation and step sampler; the reproducibility contract is in sampler.hpp.
#include "data/dataset/sampler.hpp"

#include "core/error.hpp"
#include "core/rng.hpp"

namespace dst::data {

namespace {

// Luby-Rackoff: 4 rounds of a pseudo-random function already give a pseudo-random
// permutation; 2 more add margin for the tiny half-widths (1..3 bits) of small datasets,
// where each round mixes little. Part of the reproducibility contract.
constexpr std::uint32_t kFeistelRounds = 6;

int ceil_log2(std::uint64_t n) {
  int bits = 0;
  while (bits < 64 && (std::uint64_t{1} << bits) < n)
    ++bits;
  return bits;
}

}  // namespace

FeistelPermutation::FeistelPermutation(std::uint64_t n, std::uint64_t seed, std::uint64_t epoch)
    : n_(n) {
  DST_REQUIRE(n >= 1, "sampler: a permutation needs at least one element, got n = " << n);
  // Half width h: 2^(2h) >= n, and h >= 1 so that L and R are never empty.
  const int bits = ceil_log2(n);
  half_bits_ = bits <= 2 ? 1 : (bits + 1) / 2;
  half_mask_ = (std::uint64_t{1} << half_bits_) - 1;
  static const std::uint64_t tag = core::hash_name("dst::data::sampler");
  const auto w =
      core::philox4x32({static_cast<std::uint32_t>(epoch), static_cast<std::uint32_t>(epoch >> 32),
                        static_cast<std::uint32_t>(tag), static_cast<std::uint32_t>(tag >> 32)},
                       {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)});
  key_ = {w[0], w[1]};
}

std::uint32_t FeistelPermutation::round_value(std::uint32_t round, std::uint64_t half) const {
  // half < 2^32 (h <= 32), so the counter's second word is always 0.
  const auto w = core::philox4x32({static_cast<std::uint32_t>(half), 0, round, 0}, key_);
  return w[0];
}

std::uint64_t FeistelPermutation::encrypt(std::uint64_t x) const {
  std::uint64_t left = x >> half_bits_;
  std::uint64_t right = x & half_mask_;
  for (std::uint32_t r = 0; r < kFeistelRounds; ++r) {
    const std::uint64_t next = left ^ (round_value(r, right) & half_mask_);
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

std::uint64_t FeistelPermutation::decrypt(std::uint64_t y) const {
  std::uint64_t left = y >> half_bits_;
  std::uint64_t right = y & half_mask_;
  for (std::uint32_t r = kFeistelRounds; r-- > 0;) {
    const std::uint64_t prev = right ^ (round_value(r, left) & half_mask_);
    right = left;
    left = prev;
  }
  return (left << half_bits_) | right;
}

std::uint64_t FeistelPermutation::operator()(std::uint64_t x) const {
  DST_REQUIRE(x < n_, "sampler: index " << x << " is outside the permutation of " << n_);
  // Cycle walking: the cycle of the domain permutation that contains x returns to [0, n)
  // (at x itself at the latest), so this ends, and it is a bijection on [0, n).
  std::uint64_t y = encrypt(x);
  while (y >= n_)
    y = encrypt(y);
  return y;
}

std::uint64_t FeistelPermutation::inverse(std::uint64_t y) const {
  DST_REQUIRE(y < n_, "sampler: value " << y << " is outside the permutation of " << n_);
  std::uint64_t x = decrypt(y);
  while (x >= n_)
    x = decrypt(x);
  return x;
}

Sampler::Sampler(const SamplerConfig& config) : config_(config) {
  const auto& c = config_;
  DST_REQUIRE(
      c.dp_size >= 1 && c.dp_rank >= 0 && c.dp_rank < c.dp_size,
      "sampler: data-parallel rank " << c.dp_rank << " of " << c.dp_size << " is not a valid rank");
  DST_REQUIRE(c.micro_batch_size >= 1,
              "sampler: micro_batch_size must be positive, got " << c.micro_batch_size);
  const std::uint64_t per_micro = c.micro_batch_size * static_cast<std::uint64_t>(c.dp_size);
  DST_REQUIRE(c.global_batch_size >= 1 && c.global_batch_size % per_micro == 0,
              "sampler: global_batch_size "
                  << c.global_batch_size << " is not a positive multiple of dp_size " << c.dp_size
                  << " x micro_batch_size " << c.micro_batch_size);
  DST_REQUIRE(c.num_samples >= c.global_batch_size,
              "sampler: the dataset has " << c.num_samples
                                          << " samples, fewer than one global batch of "
                                          << c.global_batch_size);
}

std::uint64_t Sampler::steps_per_epoch() const {
  return config_.num_samples / config_.global_batch_size;
}

std::uint64_t Sampler::micro_batches_per_step() const {
  return config_.global_batch_size /
         (static_cast<std::uint64_t>(config_.dp_size) * config_.micro_batch_size);
}

std::uint64_t Sampler::sample_at(std::uint64_t epoch, std::uint64_t index) const {
  return FeistelPermutation(config_.num_samples, config_.seed, epoch)(index);
}

SamplePosition Sampler::normalise(SamplePosition pos) const {
  DST_REQUIRE(pos.consumed <= config_.num_samples, "sampler: position (epoch "
                                                       << pos.epoch << ", consumed " << pos.consumed
                                                       << ") is past the end of an epoch of "
                                                       << config_.num_samples << " samples");
  // Drop-last: a tail shorter than a global batch is skipped.
  if (config_.num_samples - pos.consumed < config_.global_batch_size) return {pos.epoch + 1, 0};
  return pos;
}

std::vector<std::uint64_t> Sampler::global_batch(SamplePosition pos) const {
  pos = normalise(pos);
  const FeistelPermutation perm(config_.num_samples, config_.seed, pos.epoch);
  std::vector<std::uint64_t> ids(config_.global_batch_size);  // (G,)
  for (std::uint64_t k = 0; k < ids.size(); ++k)
    ids[k] = perm(pos.consumed + k);
  return ids;
}

std::vector<std::vector<std::uint64_t>> Sampler::rank_step(SamplePosition pos) const {
  pos = normalise(pos);
  const FeistelPermutation perm(config_.num_samples, config_.seed, pos.epoch);
  const std::uint64_t per_rank =
      config_.global_batch_size / static_cast<std::uint64_t>(config_.dp_size);
  const std::uint64_t first = pos.consumed + static_cast<std::uint64_t>(config_.dp_rank) * per_rank;
  std::vector<std::vector<std::uint64_t>> micro(micro_batches_per_step());  // (M, b)
  std::uint64_t k = first;
  for (auto& ids : micro) {
    ids.resize(config_.micro_batch_size);
    for (auto& id : ids)
      id = perm(k++);
  }
  return micro;
}

void Sampler::seek(SamplePosition pos) {
  position_ = normalise(pos);
}

std::vector<std::vector<std::uint64_t>> Sampler::next_step() {
  auto ids = rank_step(position_);
  position_ = normalise({position_.epoch, position_.consumed + config_.global_batch_size});
  return ids;
}

}  // namespace dst::data
