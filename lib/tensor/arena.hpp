#pragma once
/// \file arena.hpp
/// One allocation carved into named tensors. An Arena is built in two passes over the same
/// code: a planning pass (Mode::plan) records every tensor's size and allocates nothing,
/// which is how `dstrain check` sizes a 67B model on a laptop; then a real pass
/// (Mode::allocate) takes one aligned block of exactly the planned size, on the host or on
/// a CUDA device (tensor/memory.hpp's allocator). Tensors are 64-byte aligned (a cache
/// line; the widest vector loads).

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.hpp"

namespace dst::tensor {

class Arena {
 public:
  enum class Mode { plan, allocate };

  /// `capacity_bytes` is the exact size for Mode::allocate (from a planning pass).
  /// Device memory is allocated (and released) in the order of `stream` (a cudaStream_t).
  Arena(std::string name, Mode mode, std::size_t capacity_bytes = 0, Device device = Device::host,
        void* stream = nullptr);
  /// Mode::allocate over memory the caller owns: `memory` (64-byte aligned, at least
  /// aligned(capacity_bytes), zero-filled if tensors should start at zero) outlives the
  /// arena, which never frees it.
  Arena(std::string name, void* memory, std::size_t capacity_bytes, Device device = Device::host);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  Arena(Arena&&) noexcept;
  Arena& operator=(Arena&&) noexcept;

  /// The next tensor. In plan mode its data is nullptr; in allocate mode zero-filled.
  /// Throws dst::Error (naming the arena and the tensor) past the capacity.
  Tensor take(const std::string& what, const Shape& shape, DType dtype);

  Mode mode() const { return mode_; }
  Device device() const { return device_; }
  bool planning() const { return mode_ == Mode::plan; }
  std::size_t used_bytes() const { return used_; }
  std::size_t capacity_bytes() const { return capacity_; }
  const std::string& name() const { return name_; }
  /// Base of the block (nullptr when planning).
  void* base() const { return base_; }

  static constexpr std::size_t kAlignment = 64;
  static std::size_t aligned(std::size_t bytes) {
    return (bytes + kAlignment - 1) / kAlignment * kAlignment;
  }

 private:
  std::string name_;
  Mode mode_;
  Device device_;
  void* stream_ = nullptr;
  std::size_t capacity_ = 0;
  std::size_t used_ = 0;
  void* base_ = nullptr;
  bool owned_ = true;  ///< base_ came from allocate() and is released here
};

}  // namespace dst::tensor
