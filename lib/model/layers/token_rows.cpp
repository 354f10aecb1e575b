#include "model/layers/token_rows.hpp"

#include <string>

#include "core/error.hpp"
#include "tensor/memory.hpp"

namespace dst::model {

TokenRows::TokenRows(const int split) : split_(split) {
  if (split < 1)
    throw Error("model: token rows split over " + std::to_string(split) + " ranks (at least 1)");
}

Compute TokenRows::replicated(const Compute& c) {
  Compute whole = c;
  whole.tensor = nullptr;
  return whole;
}

TensorParallel& TokenRows::group(const Compute& c) const {
  if (c.tensor == nullptr || c.tensor->size() != split_)
    throw Error("model: token rows split over " + std::to_string(split_) +
                " ranks need their tensor group (set_tensor_parallel)");
  return *c.tensor;
}

Compute TokenRows::keeping_partial(const Compute& c) const {
  group(c);
  Compute part = c;
  part.keep_partial = true;
  return part;
}

tensor::Tensor TokenRows::own_rows(const Compute& c, const tensor::Tensor& whole,
                                   const std::int64_t n) const {
  // The group's ranks hold consecutive row ranges, in rank order (TensorParallel's gather).
  return row_range(whole, static_cast<std::int64_t>(c.tensor->rank()) * n, n);
}

void TokenRows::keep_own_rows(const Compute& c, const tensor::Tensor& whole,
                              const tensor::Tensor& out) const {
  const tensor::Tensor own = own_rows(c, whole, out.shape[0]);
  tensor::copy(c.ctx, out.ptr<float>(), own.ptr<float>(),
               static_cast<std::size_t>(own.numel()) * sizeof(float));
}

void TokenRows::norm_backward(const Compute& c, const RmsNorm& norm, const tensor::Tensor& dout,
                              const tensor::Tensor& x, const RmsNormActs& a,
                              const tensor::Tensor& dx, const RowBuffers& buf) const {
  if (split_ == 1)
    norm.backward(c, dout, x, a, dx);
  else
    norm.backward_rows(c, dout, x, a, dx, buf.d_norm);
}

tensor::Tensor TokenRows::every_row(const Compute& c, const tensor::Tensor& own,
                                    const tensor::Tensor& whole) const {
  if (split_ == 1) return own;
  group(c).all_gather(own, whole);
  return whole;
}

void TokenRows::sum_own_rows(const Compute& c, const tensor::Tensor& whole,
                             const tensor::Tensor& own) const {
  if (split_ == 1) throw Error("model: whole token rows have no rows of a rank to sum into");
  group(c).reduce_scatter(whole, own);
}

}  // namespace dst::model
