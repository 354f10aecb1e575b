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

}  // namespace dst
