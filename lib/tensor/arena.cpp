#include "tensor/arena.hpp"

#include <cstdlib>
#include <cstring>
#include <utility>

namespace dst::tensor {

Arena::Arena(std::string name, Mode mode, std::size_t capacity_bytes, Device device)
    : name_(std::move(name)), mode_(mode), device_(device), capacity_(capacity_bytes) {
  if (mode_ == Mode::allocate && capacity_ > 0) {
    if (device_ != Device::host)
      throw Error("arena '" + name_ + "': device memory comes from the CUDA back end's allocator");
    base_ = std::aligned_alloc(kAlignment, aligned(capacity_));
    if (!base_)
      throw Error("arena '" + name_ + "': cannot allocate " + std::to_string(capacity_) + " bytes");
    std::memset(base_, 0, aligned(capacity_));
  }
}

Arena::~Arena() {
  std::free(base_);
}

Arena::Arena(Arena&& o) noexcept
    : name_(std::move(o.name_)),
      mode_(o.mode_),
      device_(o.device_),
      capacity_(o.capacity_),
      used_(o.used_),
      base_(std::exchange(o.base_, nullptr)) {}

Arena& Arena::operator=(Arena&& o) noexcept {
  if (this != &o) {
    std::free(base_);
    name_ = std::move(o.name_);
    mode_ = o.mode_;
    device_ = o.device_;
    capacity_ = o.capacity_;
    used_ = o.used_;
    base_ = std::exchange(o.base_, nullptr);
  }
  return *this;
}

Tensor Arena::take(const std::string& what, const Shape& shape, DType dtype) {
  Tensor t;
  t.shape = shape;
  t.dtype = dtype;
  t.device = device_;
  const std::size_t bytes = aligned(t.bytes());
  if (mode_ == Mode::allocate) {
    if (used_ + bytes > aligned(capacity_))
      throw Error("arena '" + name_ + "': '" + what + "' " + shape.str() + " needs " +
                  std::to_string(bytes) + " bytes but only " +
                  std::to_string(aligned(capacity_) - used_) + " of " + std::to_string(capacity_) +
                  " remain (the planning pass and the real pass " + "disagree)");
    t.data = static_cast<char*>(base_) + used_;
  }
  used_ += bytes;
  return t;
}

}  // namespace dst::tensor
