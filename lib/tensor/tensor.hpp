#pragma once
/// \file tensor.hpp
/// Tensor = pointer + shape + dtype + device. A Tensor never owns memory: buffers come
/// from an Arena (activations, workspace) or the ParamStore (parameters, gradients), both
/// allocated once from the config. Shapes are row-major (the last index varies fastest).

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/dtype.hpp"
#include "core/error.hpp"

namespace dst::tensor {

enum class Device : std::uint8_t { host, cuda };

inline constexpr int kMaxRank = 4;

/// Row-major shape of up to four dimensions.
struct Shape {
  std::array<std::int64_t, kMaxRank> dims{1, 1, 1, 1};
  int rank = 0;

  Shape() = default;
  Shape(std::initializer_list<std::int64_t> d);
  std::int64_t operator[](int i) const { return dims[static_cast<std::size_t>(i)]; }
  std::int64_t numel() const;
  bool operator==(const Shape& o) const;
  bool operator!=(const Shape& o) const { return !(*this == o); }
  std::string str() const;  ///< "(8, 256, 256)"
};

/// A non-owning typed view of device or host memory.
struct Tensor {
  void* data = nullptr;
  Shape shape;
  DType dtype = DType::f32;
  Device device = Device::host;

  std::int64_t numel() const { return shape.numel(); }
  std::size_t bytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype); }
  bool empty() const { return data == nullptr; }

  /// Typed pointer; throws dst::Error if T does not match the dtype.
  template <class T>
  T* ptr() const {
    if (dtype_of<T>::value != dtype)
      throw Error("tensor: requested " + std::string(dtype_name(dtype_of<T>::value)) +
                  " pointer to a " + std::string(dtype_name(dtype)) + " tensor " + shape.str());
    return static_cast<T*>(data);
  }
  /// The same memory with another shape of equal numel (throws otherwise).
  Tensor reshaped(Shape s) const;
};

/// Throws dst::Error naming `what` unless `t` has exactly `expected` shape and dtype.
void expect_shape(const Tensor& t, const Shape& expected, DType dtype, const char* what);

}  // namespace dst::tensor
