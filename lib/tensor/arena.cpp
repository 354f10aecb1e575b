#include "tensor/arena.hpp"

#include <cstdint>
#include <string>
#include <utility>

#include "tensor/memory.hpp"

namespace dst::tensor {

Arena::Arena(std::string name, Mode mode, std::size_t capacity_bytes, Device device, void* stream)
    : name_(std::move(name)),
      mode_(mode),
      device_(device),
      stream_(stream),
      capacity_(capacity_bytes) {
  if (mode_ == Mode::allocate && capacity_ > 0)
    base_ = allocate(device_, aligned(capacity_), stream_, ("arena '" + name_ + "'").c_str());
}

Arena::Arena(std::string name, void* memory, std::size_t capacity_bytes, Device device)
    : name_(std::move(name)),
      mode_(Mode::allocate),
      device_(device),
      capacity_(capacity_bytes),
      base_(memory),
      owned_(false) {
  if (capacity_ > 0 && (memory == nullptr || reinterpret_cast<std::uintptr_t>(memory) % kAlignment))
    throw Error("arena '" + name_ + "': the memory given is null or not " +
                std::to_string(kAlignment) + "-byte aligned");
}

Arena::~Arena() {
  if (owned_) release(device_, base_, stream_);
}

Arena::Arena(Arena&& o) noexcept
    : name_(std::move(o.name_)),
      mode_(o.mode_),
      device_(o.device_),
      stream_(o.stream_),
      capacity_(o.capacity_),
      used_(o.used_),
      base_(std::exchange(o.base_, nullptr)),
      owned_(o.owned_) {}

Arena& Arena::operator=(Arena&& o) noexcept {
  if (this != &o) {
    if (owned_) release(device_, base_, stream_);
    name_ = std::move(o.name_);
    mode_ = o.mode_;
    device_ = o.device_;
    stream_ = o.stream_;
    capacity_ = o.capacity_;
    used_ = o.used_;
    base_ = std::exchange(o.base_, nullptr);
    owned_ = o.owned_;
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
