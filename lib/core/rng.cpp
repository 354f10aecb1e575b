/// \file rng.cpp
/// Philox4x32-10 and the (seed, stream, index) -> value mapping of rng.hpp.
///
/// Reproducibility contract (changing any line of it changes every run's initial weights,
/// dropout masks and data order, so it is versioned with the checkpoint format):
///   key     = { seed & 0xffffffff, seed >> 32 }
///   counter = { index & 0xffffffff, index >> 32, stream & 0xffffffff, stream >> 32 }
///   block   = philox4x32(counter, key)  -> words w0..w3
///   uniform01 = (w0 >> 8) * 2^-24                                  in [0, 1)
///   normal    = sqrt(-2 ln u1) * cos(2 pi u2), in double, rounded once to float, where
///               u1 = ((w0:w1 as 64 bits) >> 11 + 1) * 2^-53        in (0, 1]
///               u2 = ((w2:w3 as 64 bits) >> 11)     * 2^-53        in [0, 1)
/// uniform01 and normal at the same (seed, stream, index) share a block and are therefore
/// correlated; a stream is meant to be drawn from with one distribution only.
#include "core/rng.hpp"

#include <cmath>

namespace dst::core {

namespace detail {
namespace {

// Salmon et al. (SC'11), Random123 philox.h: the multipliers and the Weyl key increments
// (golden ratio and sqrt(3) - 1, scaled to 32 bits).
constexpr std::uint32_t kPhiloxM0 = 0xD2511F53U;
constexpr std::uint32_t kPhiloxM1 = 0xCD9E8D57U;
constexpr std::uint32_t kPhiloxW0 = 0x9E3779B9U;
constexpr std::uint32_t kPhiloxW1 = 0xBB67AE85U;
constexpr int kPhiloxRounds = 10;

using Block = std::array<std::uint32_t, 4>;
using Key = std::array<std::uint32_t, 2>;

Block philox_round(const Block& x, const Key& k) {
  const std::uint64_t p0 = static_cast<std::uint64_t>(kPhiloxM0) * x[0];
  const std::uint64_t p1 = static_cast<std::uint64_t>(kPhiloxM1) * x[2];
  const auto hi0 = static_cast<std::uint32_t>(p0 >> 32);
  const auto lo0 = static_cast<std::uint32_t>(p0);
  const auto hi1 = static_cast<std::uint32_t>(p1 >> 32);
  const auto lo1 = static_cast<std::uint32_t>(p1);
  return {hi1 ^ x[1] ^ k[0], lo1, hi0 ^ x[3] ^ k[1], lo0};
}

Block block_for(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  return philox4x32({static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32),
                     static_cast<std::uint32_t>(stream), static_cast<std::uint32_t>(stream >> 32)},
                    {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)});
}

// 2^-24 and 2^-53: the spacing of floats / doubles in [0.5, 1), so the products below are
// exact and never round up to 1.
constexpr float kTwoPowMinus24 = 0x1p-24F;
constexpr double kTwoPowMinus53 = 0x1p-53;
constexpr double kTwoPi = 6.283185307179586476925286766559;

}  // namespace
}  // namespace detail

std::array<std::uint32_t, 4> philox4x32(std::array<std::uint32_t, 4> counter,
                                        std::array<std::uint32_t, 2> key) {
  // Random123 order: round with the user key first, then bump the key before each of
  // the remaining rounds (10 rounds, 9 bumps).
  counter = detail::philox_round(counter, key);
  for (int r = 1; r < detail::kPhiloxRounds; ++r) {
    key[0] += detail::kPhiloxW0;
    key[1] += detail::kPhiloxW1;
    counter = detail::philox_round(counter, key);
  }
  return counter;
}

std::uint64_t hash_name(std::string_view name) {
  // FNV-1a 64-bit offset basis and prime (Fowler, Noll, Vo; IETF draft-eastlake-fnv).
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (const char ch : name) {
    h ^= static_cast<std::uint8_t>(ch);
    h *= 0x100000001b3ULL;
  }
  return h;
}

float uniform01(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  const auto w = detail::block_for(seed, stream, index);
  return static_cast<float>(w[0] >> 8) * detail::kTwoPowMinus24;
}

float normal(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  const auto w = detail::block_for(seed, stream, index);
  const std::uint64_t a = (static_cast<std::uint64_t>(w[0]) << 32 | w[1]) >> 11;
  const std::uint64_t b = (static_cast<std::uint64_t>(w[2]) << 32 | w[3]) >> 11;
  // u1 in (0, 1] keeps log finite; the largest |z| is sqrt(-2 ln 2^-53) ~ 8.57.
  const double u1 = static_cast<double>(a + 1) * detail::kTwoPowMinus53;
  const double u2 = static_cast<double>(b) * detail::kTwoPowMinus53;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(detail::kTwoPi * u2));
}

}  // namespace dst::core
