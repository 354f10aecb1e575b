#pragma once
/// \file rng.hpp
/// Counter-based random numbers: a value is a pure function of (seed, stream, index), so
/// results do not depend on rank count, thread count or call order, and every rank can
/// produce any slice of a tensor's initial values without communication.
/// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11).
///
/// Reproducibility contract (part of the checkpoint/run format: changing it changes every
/// run's initial weights):
///   key     = { seed lo32, seed hi32 }
///   counter = { index lo32, index hi32, stream lo32, stream hi32 }
///   uniform01 = (w0 >> 8) * 2^-24 of the block's words w0..w3
///   normal    = sqrt(-2 ln u1) cos(2 pi u2) in double, u1 = ((w0:w1) >> 11 + 1) 2^-53,
///               u2 = ((w2:w3) >> 11) 2^-53, rounded once to float
/// uniform01 and normal at one (seed, stream, index) share a block: draw a stream with one
/// distribution only.

#include <array>
#include <cstdint>
#include <string_view>

namespace dst::core {

/// One Philox4x32-10 block: 4 x 32 random bits for a 128-bit counter and 64-bit key.
std::array<std::uint32_t, 4> philox4x32(std::array<std::uint32_t, 4> counter,
                                        std::array<std::uint32_t, 2> key);

/// Stable 64-bit hash of a name (FNV-1a), to key a stream by a tensor's name.
std::uint64_t hash_name(std::string_view name);

/// Uniform in [0, 1) with 24 random bits (exactly representable floats).
float uniform01(std::uint64_t seed, std::uint64_t stream, std::uint64_t index);

/// Standard normal N(0, 1) by Box-Muller from one Philox block (the cosine branch),
/// computed in double and rounded once to float.
float normal(std::uint64_t seed, std::uint64_t stream, std::uint64_t index);

}  // namespace dst::core
