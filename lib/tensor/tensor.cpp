#include "tensor/tensor.hpp"

#include <sstream>

namespace dst::tensor {

Shape::Shape(std::initializer_list<std::int64_t> d) {
  if (d.size() > static_cast<std::size_t>(kMaxRank))
    throw Error("tensor: at most " + std::to_string(kMaxRank) + " dimensions, got " +
                std::to_string(d.size()));
  rank = static_cast<int>(d.size());
  std::size_t i = 0;
  for (const auto v : d) {
    if (v < 0) throw Error("tensor: negative dimension " + std::to_string(v));
    dims[i++] = v;
  }
}

std::int64_t Shape::numel() const {
  std::int64_t n = 1;
  for (int i = 0; i < rank; ++i)
    n *= dims[static_cast<std::size_t>(i)];
  return n;
}

bool Shape::operator==(const Shape& o) const {
  if (rank != o.rank) return false;
  for (int i = 0; i < rank; ++i)
    if (dims[static_cast<std::size_t>(i)] != o.dims[static_cast<std::size_t>(i)]) return false;
  return true;
}

std::string Shape::str() const {
  std::ostringstream os;
  os << "(";
  for (int i = 0; i < rank; ++i)
    os << (i ? ", " : "") << dims[static_cast<std::size_t>(i)];
  os << ")";
  return os.str();
}

Tensor Tensor::reshaped(Shape s) const {
  if (s.numel() != numel()) throw Error("tensor: cannot reshape " + shape.str() + " to " + s.str());
  Tensor t = *this;
  t.shape = s;
  return t;
}

void expect_shape(const Tensor& t, const Shape& expected, DType dtype, const char* what) {
  if (t.shape != expected || t.dtype != dtype)
    throw Error(std::string(what) + ": expected " + std::string(dtype_name(dtype)) + " " +
                expected.str() + ", got " + std::string(dtype_name(t.dtype)) + " " + t.shape.str());
}

}  // namespace dst::tensor
