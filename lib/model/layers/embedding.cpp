#include "model/layers/embedding.hpp"

#include <string>

#include "core/error.hpp"
#include "kernels/kernels.hpp"
#include "model/layers/tensor_parallel.hpp"

namespace dst::model {

namespace {
constexpr const char* kTableName = kEmbeddingTableName;
}  // namespace

Embedding::Embedding(std::int64_t vocab, std::int64_t dim, int tensor_parallel, int row_split)
    : vocab_(vocab), dim_(dim), tp_(tensor_parallel), rows_(row_split) {}

void Embedding::declare(std::vector<ParamSpec>& specs) const {
  add_param(specs, kTableName, {vocab_ / tp_, dim_}, Init::normal, kInitStd, true, Split::vocab);
}

void Embedding::bind(const ParamStore& params) {
  table_ = params.index_of(kTableName);
}

void Embedding::forward(const Compute& c, const tensor::Tensor& tokens, const tensor::Tensor& out,
                        const RowBuffers& buf) const {
  // Not stored: the rows are the (already rounded) weights themselves.
  if (tp_ == 1) {
    kernels::embedding_forward(c.ctx, tokens, c.weight(table_), out);
    return;
  }
  const tensor::Tensor w = c.weight(table_);
  const VocabSlice s = slice(c);
  if (rows_.split() == 1) {
    c.tensor->counted(out.bytes(), [&] {
      vocab_parallel_embedding_forward(c.ctx, c.tensor->group(), s, tokens, w, out);
    });
    return;
  }
  const tensor::Tensor& whole = buf.gathered;
  if (whole.numel() != tokens.numel() * dim_ || out.numel() * rows_.split() != whole.numel())
    throw Error("model: the embedding's rows " + out.shape.str() + " are not 1/" +
                std::to_string(rows_.split()) + " of " + whole.shape.str() + " for " +
                std::to_string(tokens.numel()) + " tokens");
  // A reduce-scatter: half of an all-reduce of the whole rows (TensorTraffic).
  c.tensor->counted(whole.bytes() / 2, [&] {
    vocab_parallel_embedding_scatter(c.ctx, c.tensor->group(), s, tokens, w, whole, out);
  });
}

VocabSlice Embedding::slice(const Compute& c) const {
  return VocabSlice::of_group(vocab_, c.tensor, tp_, "the embedding");
}

void Embedding::backward(const Compute& c, const tensor::Tensor& tokens, const tensor::Tensor& dout,
                         const RowBuffers& buf) const {
  const tensor::Tensor d = rows_.every_row(c, dout, buf.gathered);
  if (tp_ > 1) {
    vocab_parallel_embedding_backward(c.ctx, slice(c), tokens, d, c.grad(table_));
    return;
  }
  kernels::embedding_backward(c.ctx, tokens, d, c.grad(table_));
}

}  // namespace dst::model
