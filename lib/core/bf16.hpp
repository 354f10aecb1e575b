#pragma once
/// \file bf16.hpp
/// bfloat16 and IEEE binary16 storage types with exact conversions: float -> 16 bits
/// rounds to nearest, ties to even; NaN stays NaN (quiet), infinities and signed zeros are
/// kept; half also handles subnormals. Arithmetic is done in float.

#include <cstdint>

namespace dst {

struct bf16 {
  std::uint16_t bits = 0;
  static bf16 from_float(float f);
  float to_float() const;
};

struct f16 {
  std::uint16_t bits = 0;
  static f16 from_float(float f);
  float to_float() const;
};

/// `x` stored as bfloat16 and read back: the nearest bf16 value (ties to even), as a
/// float. What the emulated low-precision storage of the host build
/// (kernels::round_to_storage, docs/precision.md) does to every stored value.
float round_to_bf16(float x);
/// `x` stored as IEEE binary16 and read back: nearest (ties to even), |x| >= 65520
/// becomes +-inf, values below 2^-14 become subnormals (multiples of 2^-24), NaN stays NaN.
float round_to_f16(float x);

}  // namespace dst
