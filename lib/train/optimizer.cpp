#include "train/optimizer.hpp"

#include <algorithm>
#include <string>

#include "core/error.hpp"
#include "tensor/memory.hpp"

namespace dst::train {

namespace {
/// [first, last) checked against the store's buffer, as the moments' range.
std::size_t checked_last(const model::ParamStore& store, std::size_t first, std::size_t last) {
  if (first > last || last > store.buffer_elements())
    throw Error("train::AdamW: the moments' elements [" + std::to_string(first) + ", " +
                std::to_string(last) + ") are not within the " +
                std::to_string(store.buffer_elements()) + " of the flat buffers");
  return last;
}
}  // namespace

AdamW::AdamW(const config::OptimizerSection& opt, const model::ParamStore& store)
    : AdamW(opt, store, 0, store.buffer_elements()) {}

AdamW::AdamW(const config::OptimizerSection& opt, const model::ParamStore& store, std::size_t first,
             std::size_t last, bool master)
    : opt_(opt),
      elements_(store.buffer_elements()),
      first_(first),
      last_(checked_last(store, first, last)),
      has_master_(master),
      m_("adamw first moments",
         store.planning() ? tensor::Arena::Mode::plan : tensor::Arena::Mode::allocate,
         (last - first) * sizeof(float), tensor::device_of(store.context()),
         store.context().stream),
      v_("adamw second moments",
         store.planning() ? tensor::Arena::Mode::plan : tensor::Arena::Mode::allocate,
         (last - first) * sizeof(float), tensor::device_of(store.context()),
         store.context().stream),
      master_("adamw master parameters",
              store.planning() ? tensor::Arena::Mode::plan : tensor::Arena::Mode::allocate,
              master ? (last - first) * sizeof(float) : 0, tensor::device_of(store.context()),
              store.context().stream) {
  ranges_.reserve(store.size());
  for (const auto& s : store.specs())
    ranges_.push_back(Range{s.offset, s.shape, s.weight_decay});
  // One block each, taken whole so used_bytes reports it (as the ParamStore does).
  const auto n = static_cast<std::int64_t>(last_ - first_);
  if (n == 0) return;  // an empty shard: no moments at all
  m_.take("flat first moments", {n}, DType::f32);
  v_.take("flat second moments", {n}, DType::f32);
  if (has_master_) master_.take("flat master parameters", {n}, DType::f32);
}

tensor::Tensor AdamW::view(const tensor::Arena& arena, std::size_t i) const {
  const Range& r = ranges_.at(i);
  if (r.offset < first_ || r.offset + static_cast<std::size_t>(r.shape.numel()) > last_)
    throw Error("train::AdamW: tensor " + std::to_string(i) + " at elements [" +
                std::to_string(r.offset) + ", " +
                std::to_string(r.offset + static_cast<std::size_t>(r.shape.numel())) +
                ") is not within the moments' range [" + std::to_string(first_) + ", " +
                std::to_string(last_) + ")");
  tensor::Tensor t;
  t.shape = ranges_.at(i).shape;
  t.dtype = DType::f32;
  t.device = arena.device();
  t.data =
      arena.planning() ? nullptr : static_cast<float*>(arena.base()) + (ranges_[i].offset - first_);
  return t;
}

tensor::Tensor AdamW::piece(const tensor::Arena& arena, std::size_t a, std::size_t b) const {
  tensor::Tensor t;
  t.shape = tensor::Shape{static_cast<std::int64_t>(b - a)};
  t.dtype = DType::f32;
  t.device = arena.device();
  t.data = static_cast<float*>(arena.base()) + (a - first_);
  return t;
}

tensor::Tensor AdamW::m(std::size_t i) const {
  return view(m_, i);
}

tensor::Tensor AdamW::v(std::size_t i) const {
  return view(v_, i);
}

AdamWState AdamW::state() const {
  return AdamWState{static_cast<float*>(m_.base()),
                    static_cast<float*>(v_.base()),
                    first_,
                    last_ - first_,
                    step_,
                    has_master_ ? static_cast<float*>(master_.base()) : nullptr};
}

void AdamW::set_step_count(std::int64_t steps) {
  if (steps < 0)
    throw Error("train::AdamW: a restored step count must be >= 0, got " + std::to_string(steps));
  step_ = steps;
}

void AdamW::step(const tensor::ExecContext& ctx, model::ParamStore& store, double lr,
                 double grad_scale) {
  step(ctx, store, lr, grad_scale, first_, last_);
}

void AdamW::step(const tensor::ExecContext& ctx, model::ParamStore& store, double lr,
                 double grad_scale, std::size_t first, std::size_t last) {
  if (first > last || first < first_ || last > last_)
    throw Error("train::AdamW::step: elements [" + std::to_string(first) + ", " +
                std::to_string(last) + ") are not within the moments' [" + std::to_string(first_) +
                ", " + std::to_string(last_) + ") of the " + std::to_string(elements_) +
                " in the flat buffers");
  if (planning() || store.planning())
    throw Error("train::AdamW::step: a planning optimizer or parameter store has no memory");
  if (store.buffer_elements() != elements_ || store.size() != ranges_.size())
    throw Error("train::AdamW::step: the parameter store (" + std::to_string(store.size()) +
                " tensors, " + std::to_string(store.buffer_elements()) +
                " elements) is not the one the moments were laid out for (" +
                std::to_string(ranges_.size()) + " tensors, " + std::to_string(elements_) +
                " elements)");
  kernels::AdamWHyper h;
  h.lr = lr;
  h.beta1 = opt_.betas[0];
  h.beta2 = opt_.betas[1];
  h.eps = opt_.eps;
  h.step = step_ + 1;
  h.grad_scale = grad_scale;
  for (std::size_t i = 0; i < ranges_.size(); ++i) {
    h.weight_decay = ranges_[i].decay ? opt_.weight_decay : 0.0;
    const std::size_t begin = ranges_[i].offset;
    const auto numel = static_cast<std::size_t>(ranges_[i].shape.numel());
    if (first <= begin && begin + numel <= last) {  // the whole tensor
      kernels::adamw_step(ctx, has_master_ ? view(master_, i) : store.param(i), store.grad(i), m(i),
                          v(i), h);
      continue;
    }
    const std::size_t a = std::max(begin, first), b = std::min(begin + numel, last);
    if (a >= b) continue;
    // The elements [a, b) of the tensor, as 1-d views of the four buffers.
    const auto part = [&](const tensor::Tensor& t) {
      tensor::Tensor p = t;
      p.shape = tensor::Shape{static_cast<std::int64_t>(b - a)};
      p.data = t.ptr<float>() + (a - begin);
      return p;
    };
    kernels::adamw_step(ctx, has_master_ ? piece(master_, a, b) : part(store.param(i)),
                        part(store.grad(i)), piece(m_, a, b), piece(v_, a, b), h);
  }
  // Counted only once every tensor has stepped: a throw above leaves t unchanged (the
  // first kernel call validates the hyper-parameters, before any tensor changes).
  ++step_;
}

}  // namespace dst::train
