#include "model/layers/embedding.hpp"

#include "kernels/kernels.hpp"

namespace dst::model {

namespace {
constexpr const char* kTableName = "model.embed_tokens.weight";
}  // namespace

Embedding::Embedding(std::int64_t vocab, std::int64_t dim) : vocab_(vocab), dim_(dim) {}

void Embedding::declare(std::vector<ParamSpec>& specs) const {
  add_param(specs, kTableName, {vocab_, dim_}, Init::normal, kInitStd, true, Split::vocab);
}

void Embedding::bind(const ParamStore& params) {
  table_ = params.index_of(kTableName);
}

void Embedding::forward(const Compute& c, const tensor::Tensor& tokens,
                        const tensor::Tensor& out) const {
  // Not stored: the rows are the (already rounded) weights themselves.
  kernels::embedding_forward(c.ctx, tokens, c.weight(table_), out);
}

void Embedding::backward(const Compute& c, const tensor::Tensor& tokens,
                         const tensor::Tensor& dout) const {
  kernels::embedding_backward(c.ctx, tokens, dout, c.grad(table_));
}

}  // namespace dst::model
