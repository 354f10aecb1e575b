#include "train/optimizer.hpp"

#include <algorithm>
#include <string>

#include "core/error.hpp"
#include "tensor/memory.hpp"

namespace dst::train {

AdamW::AdamW(const config::OptimizerSection& opt, const model::ParamStore& store)
    : opt_(opt),
      elements_(store.buffer_elements()),
      m_("adamw first moments",
         store.planning() ? tensor::Arena::Mode::plan : tensor::Arena::Mode::allocate,
         elements_ * sizeof(float), tensor::device_of(store.context()), store.context().stream),
      v_("adamw second moments",
         store.planning() ? tensor::Arena::Mode::plan : tensor::Arena::Mode::allocate,
         elements_ * sizeof(float), tensor::device_of(store.context()), store.context().stream) {
  ranges_.reserve(store.size());
  for (const auto& s : store.specs())
    ranges_.push_back(Range{s.offset, s.shape, s.weight_decay});
  // One block each, taken whole so used_bytes reports it (as the ParamStore does).
  const auto n = static_cast<std::int64_t>(elements_);
  m_.take("flat first moments", {n}, DType::f32);
  v_.take("flat second moments", {n}, DType::f32);
}

tensor::Tensor AdamW::view(const tensor::Arena& arena, std::size_t i) const {
  tensor::Tensor t;
  t.shape = ranges_.at(i).shape;
  t.dtype = DType::f32;
  t.device = arena.device();
  t.data = arena.planning() ? nullptr : static_cast<float*>(arena.base()) + ranges_[i].offset;
  return t;
}

tensor::Tensor AdamW::m(std::size_t i) const {
  return view(m_, i);
}

tensor::Tensor AdamW::v(std::size_t i) const {
  return view(v_, i);
}

AdamWState AdamW::state() const {
  return AdamWState{static_cast<float*>(m_.base()), static_cast<float*>(v_.base()), elements_,
                    step_};
}

void AdamW::set_step_count(std::int64_t steps) {
  if (steps < 0)
    throw Error("train::AdamW: a restored step count must be >= 0, got " + std::to_string(steps));
  step_ = steps;
}

void AdamW::step(const tensor::ExecContext& ctx, model::ParamStore& store, double lr,
                 double grad_scale) {
  step(ctx, store, lr, grad_scale, 0, elements_);
}

void AdamW::step(const tensor::ExecContext& ctx, model::ParamStore& store, double lr,
                 double grad_scale, std::size_t first, std::size_t last) {
  if (first > last || last > elements_)
    throw Error("train::AdamW::step: elements [" + std::to_string(first) + ", " +
                std::to_string(last) + ") are not within the " + std::to_string(elements_) +
                " of the flat buffers");
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
      kernels::adamw_step(ctx, store.param(i), store.grad(i), m(i), v(i), h);
      continue;
    }
    const std::size_t a = std::max(begin, first), b = std::min(begin + numel, last);
    if (a >= b) continue;
    // The elements [a, b) of the tensor, as 1-d views of the four buffers.
    const auto piece = [&](const tensor::Tensor& t) {
      tensor::Tensor p = t;
      p.shape = tensor::Shape{static_cast<std::int64_t>(b - a)};
      p.data = t.ptr<float>() + (a - begin);
      return p;
    };
    kernels::adamw_step(ctx, piece(store.param(i)), piece(store.grad(i)), piece(m(i)), piece(v(i)),
                        h);
  }
  // Counted only once every tensor has stepped: a throw above leaves t unchanged (the
  // first kernel call validates the hyper-parameters, before any tensor changes).
  ++step_;
}

}  // namespace dst::train
