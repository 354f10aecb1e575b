#pragma once
/// \file dtype.hpp
/// Element types of tensors and communication buffers.

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace dst {

enum class DType : std::uint8_t { f32, f64, bf16, f16, i32, i64, u8, u32, u64 };

/// Size of one element in bytes.
constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f64:
    case DType::i64:
    case DType::u64:
      return 8;
    case DType::f32:
    case DType::i32:
    case DType::u32:
      return 4;
    case DType::bf16:
    case DType::f16:
      return 2;
    case DType::u8:
      return 1;
  }
  return 0;
}

/// Short name used in messages and file metadata ("f32", "bf16", ...).
constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::f64:
      return "f64";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::u8:
      return "u8";
    case DType::u32:
      return "u32";
    case DType::u64:
      return "u64";
  }
  return "?";
}

/// Maps a C++ element type to its DType.
template <class T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::f64;
};
template <>
struct dtype_of<std::int32_t> {
  static constexpr DType value = DType::i32;
};
template <>
struct dtype_of<std::int64_t> {
  static constexpr DType value = DType::i64;
};
template <>
struct dtype_of<std::uint8_t> {
  static constexpr DType value = DType::u8;
};
template <>
struct dtype_of<std::uint32_t> {
  static constexpr DType value = DType::u32;
};
template <>
struct dtype_of<std::uint64_t> {
  static constexpr DType value = DType::u64;
};

}  // namespace dst
