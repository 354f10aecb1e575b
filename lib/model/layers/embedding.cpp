#include "model/layers/embedding.hpp"

#include <string>

#include "core/error.hpp"
#include "kernels/kernels.hpp"
#include "model/layers/tensor_parallel.hpp"

namespace dst::model {

namespace {
constexpr const char* kTableName = kEmbeddingTableName;
}  // namespace

Embedding::Embedding(std::int64_t vocab, std::int64_t dim, int tensor_parallel)
    : vocab_(vocab), dim_(dim), tp_(tensor_parallel) {}

void Embedding::declare(std::vector<ParamSpec>& specs) const {
  add_param(specs, kTableName, {vocab_ / tp_, dim_}, Init::normal, kInitStd, true, Split::vocab);
}

void Embedding::bind(const ParamStore& params) {
  table_ = params.index_of(kTableName);
}

void Embedding::forward(const Compute& c, const tensor::Tensor& tokens,
                        const tensor::Tensor& out) const {
  // Not stored: the rows are the (already rounded) weights themselves.
  if (tp_ > 1) {
    const tensor::Tensor w = c.weight(table_);
    const VocabSlice s = slice(c);
    c.tensor->counted(out.bytes(), [&] {
      vocab_parallel_embedding_forward(c.tensor->group(), s, tokens.ptr<std::int32_t>(),
                                       tokens.numel(), w.ptr<float>(), dim_, out.ptr<float>());
    });
    return;
  }
  kernels::embedding_forward(c.ctx, tokens, c.weight(table_), out);
}

void Embedding::forward_rows(const Compute& c, const tensor::Tensor& tokens,
                             const tensor::Tensor& whole, const tensor::Tensor& rows) const {
  if (tp_ == 1) throw Error("model: the embedding splits its rows only under tensor parallelism");
  const tensor::Tensor w = c.weight(table_);
  const VocabSlice s = slice(c);
  if (whole.numel() != tokens.numel() * dim_ || rows.numel() * tp_ != whole.numel())
    throw Error("model: the embedding's rows " + rows.shape.str() + " are not 1/" +
                std::to_string(tp_) + " of " + whole.shape.str() + " for " +
                std::to_string(tokens.numel()) + " tokens");
  // A reduce-scatter: half of an all-reduce of the whole rows (TensorTraffic).
  c.tensor->counted(whole.bytes() / 2, [&] {
    vocab_parallel_embedding_scatter(c.tensor->group(), s, tokens.ptr<std::int32_t>(),
                                     tokens.numel(), w.ptr<float>(), dim_, whole.ptr<float>(),
                                     rows.ptr<float>());
  });
}

VocabSlice Embedding::slice(const Compute& c) const {
  return VocabSlice::of_group(vocab_, c.tensor, tp_, "the embedding");
}

void Embedding::backward(const Compute& c, const tensor::Tensor& tokens,
                         const tensor::Tensor& dout) const {
  if (tp_ > 1) {
    vocab_parallel_embedding_backward(slice(c), tokens.ptr<std::int32_t>(), tokens.numel(),
                                      dout.ptr<float>(), dim_, c.grad(table_).ptr<float>());
    return;
  }
  kernels::embedding_backward(c.ctx, tokens, dout, c.grad(table_));
}

}  // namespace dst::model
