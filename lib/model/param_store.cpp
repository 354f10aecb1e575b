#include "model/param_store.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/parallel.hpp"
#include "core/rng.hpp"
#include "tensor/memory.hpp"

namespace dst::model {

std::string_view split_name(Split s) {
  switch (s) {
    case Split::replicated:
      return "replicated";
    case Split::column:
      return "column";
    case Split::row:
      return "row";
    case Split::vocab:
      return "vocab";
  }
  return "?";
}

namespace {
/// The dimension a split slices: 0 (rows) for column and vocab, 1 (columns) for row.
int split_dim(const ParamSpec& s) {
  return s.split == Split::row ? 1 : 0;
}

/// Rows and columns of a 2-D slice, and the slice's offset along its split dimension.
struct SliceGeometry {
  std::uint64_t rows = 0, cols = 0;  ///< of the slice
  std::uint64_t whole_cols = 0;      ///< of the logical tensor
  std::uint64_t row0 = 0, col0 = 0;  ///< where the slice starts in it
};

SliceGeometry geometry(const ParamSpec& s) {
  if (s.shape.rank != 2)
    throw Error("model: tensor-parallel parameter " + s.name + " is not a matrix");
  SliceGeometry g;
  g.rows = static_cast<std::uint64_t>(s.shape.dims[0]);
  g.cols = static_cast<std::uint64_t>(s.shape.dims[1]);
  g.whole_cols = g.cols;
  if (split_dim(s) == 0) {
    g.row0 = g.rows * static_cast<std::uint64_t>(s.tp_rank);
  } else {
    g.col0 = g.cols * static_cast<std::uint64_t>(s.tp_rank);
    g.whole_cols = g.cols * static_cast<std::uint64_t>(s.tp_size);
  }
  return g;
}

bool sliced(const ParamSpec& s) {
  return s.tp_size > 1 && s.split != Split::replicated;
}
}  // namespace

tensor::Shape logical_shape(const ParamSpec& s) {
  tensor::Shape shape = s.shape;
  if (sliced(s)) shape.dims[static_cast<std::size_t>(split_dim(s))] *= s.tp_size;
  return shape;
}

std::uint64_t logical_index(const ParamSpec& s, std::uint64_t j) {
  if (!sliced(s)) return j;
  const SliceGeometry g = geometry(s);
  return (g.row0 + j / g.cols) * g.whole_cols + g.col0 + j % g.cols;
}

void copy_slice_from_whole(const ParamSpec& s, const float* whole, float* slice) {
  if (!sliced(s)) {
    std::copy(whole, whole + s.shape.numel(), slice);
    return;
  }
  const SliceGeometry g = geometry(s);
  for (std::uint64_t r = 0; r < g.rows; ++r) {
    const float* from = whole + (g.row0 + r) * g.whole_cols + g.col0;
    std::copy(from, from + g.cols, slice + r * g.cols);
  }
}

void copy_slice_to_whole(const ParamSpec& s, const float* slice, float* whole) {
  if (!sliced(s)) {
    std::copy(slice, slice + s.shape.numel(), whole);
    return;
  }
  const SliceGeometry g = geometry(s);
  for (std::uint64_t r = 0; r < g.rows; ++r)
    std::copy(slice + r * g.cols, slice + (r + 1) * g.cols,
              whole + (g.row0 + r) * g.whole_cols + g.col0);
}

void mark_tensor_slices(std::vector<ParamSpec>& specs, int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size)
    throw Error("model: tensor-parallel rank " + std::to_string(rank) + " of " +
                std::to_string(size));
  for (ParamSpec& s : specs) {
    if (s.split == Split::replicated) continue;
    if (s.tp_replicas < 1 || size % s.tp_replicas != 0)
      throw Error("model: " + s.name + " is shared by " + std::to_string(s.tp_replicas) +
                  " tensor-parallel ranks, which does not divide the " + std::to_string(size));
    s.tp_rank = rank / s.tp_replicas;
    s.tp_size = size / s.tp_replicas;
  }
}

namespace {
// Offsets are rounded to 16 floats (64 bytes) so every tensor starts on a cache line.
constexpr std::size_t kAlignElements = tensor::Arena::kAlignment / sizeof(float);
// Values one initialisation thread draws at least (about 3 ms): smaller tensors (norms,
// the tiny model's) stay on one thread, where starting others would cost more.
constexpr std::uint64_t kInitSlice = 1 << 16;

std::size_t layout_offsets(std::vector<ParamSpec>& specs, std::int64_t& count) {
  std::size_t offset = 0;
  count = 0;
  for (auto& s : specs) {
    s.offset = offset;
    const auto n = static_cast<std::size_t>(s.shape.numel());
    count += static_cast<std::int64_t>(n);
    offset += (n + kAlignElements - 1) / kAlignElements * kAlignElements;
  }
  return offset;
}
}  // namespace

std::size_t flat_buffer_elements(const std::vector<ParamSpec>& specs) {
  std::vector<ParamSpec> copy = specs;
  std::int64_t count = 0;
  return layout_offsets(copy, count);
}

namespace {
/// The arena `name` ("gradients", "parameters"): its own allocation, or `memory` given
/// from outside.
tensor::Arena buffer_arena(const char* name, tensor::Arena::Mode mode, std::size_t bytes,
                           const tensor::ExecContext& ctx, float* memory) {
  if (memory == nullptr)
    return tensor::Arena(name, mode, bytes, tensor::device_of(ctx), ctx.stream);
  if (mode != tensor::Arena::Mode::allocate || tensor::device_of(ctx) != tensor::Device::host)
    throw Error(std::string("model: ") + name +
                " memory given from outside must be host memory of a real run");
  return tensor::Arena(name, memory, bytes, tensor::Device::host);
}
}  // namespace

ParamStore::ParamStore(std::vector<ParamSpec> specs, tensor::Arena::Mode mode,
                       tensor::ExecContext ctx, float* gradient_memory, float* param_memory)
    : specs_(std::move(specs)),
      buffer_elements_(layout_offsets(specs_, parameter_count_)),
      ctx_(ctx),
      params_(
          buffer_arena("parameters", mode, buffer_elements_ * sizeof(float), ctx, param_memory)),
      grads_(
          buffer_arena("gradients", mode, buffer_elements_ * sizeof(float), ctx, gradient_memory)) {
  // Reserve the whole block in each arena so used_bytes reports it.
  params_.take("flat parameters", {static_cast<std::int64_t>(buffer_elements_)}, DType::f32);
  grads_.take("flat gradients", {static_cast<std::int64_t>(buffer_elements_)}, DType::f32);
}

std::size_t ParamStore::index_of(const std::string& name) const {
  for (std::size_t i = 0; i < specs_.size(); ++i)
    if (specs_[i].name == name) return i;
  throw Error("model: no parameter named '" + name + "'");
}

tensor::Tensor ParamStore::param(std::size_t i) const {
  tensor::Tensor t;
  t.shape = specs_.at(i).shape;
  t.dtype = DType::f32;
  t.device = params_.device();
  t.data = planning() ? nullptr : params_data() + specs_[i].offset;
  return t;
}

tensor::Tensor ParamStore::grad(std::size_t i) const {
  tensor::Tensor t;
  t.shape = specs_.at(i).shape;
  t.dtype = DType::f32;
  t.device = grads_.device();
  t.data = planning() ? nullptr : grads_data() + specs_[i].offset;
  return t;
}

tensor::Tensor ParamStore::params_flat() const {
  tensor::Tensor t;
  t.shape = tensor::Shape{static_cast<std::int64_t>(buffer_elements_)};
  t.device = params_.device();
  t.data = params_data();
  return t;
}

tensor::Tensor ParamStore::grads_flat() const {
  tensor::Tensor t;
  t.shape = tensor::Shape{static_cast<std::int64_t>(buffer_elements_)};
  t.device = grads_.device();
  t.data = grads_data();
  return t;
}

void ParamStore::initialize(const std::uint64_t seed, const unsigned threads) {
  if (planning()) throw Error("model: cannot initialise a parameter store that only plans");
  // Device memory: each tensor is drawn into a host buffer, then copied.
  const bool on_host = params_.device() == tensor::Device::host;
  std::vector<float> staging;
  for (const auto& s : specs_) {
    const auto n = static_cast<std::uint64_t>(s.shape.numel());
    if (!on_host) staging.resize(n);
    float* p = on_host ? params_data() + s.offset : staging.data();
    if (s.init == Init::ones || s.init == Init::zeros) {
      const float value = s.init == Init::ones ? 1.0f : 0.0f;
      for (std::uint64_t j = 0; j < n; ++j)
        p[j] = value;
    } else {
      // About 54 ns per value (Philox, log and cos in double): 90 s for deepseek-1b's
      // 1.6 B on one core, so the rank's cores share it (the same bits in any split).
      const std::uint64_t stream = core::hash_name(s.name);
      core::parallel_slices(n, threads, kInitSlice, [&](std::uint64_t begin, std::uint64_t end) {
        for (std::uint64_t j = begin; j < end; ++j)
          p[j] = s.std * core::normal(seed, stream, logical_index(s, j));
      });
    }
    if (!on_host) tensor::copy(ctx_, params_data() + s.offset, p, n * sizeof(float));
  }
}

void ParamStore::zero_grads() {
  if (!planning()) tensor::fill_zero(ctx_, grads_data(), buffer_elements_ * sizeof(float));
}

}  // namespace dst::model
