#include "model/transformer.hpp"

#include <string>

#include "core/error.hpp"

namespace dst::model {

Transformer::Transformer(const config::ModelSection& m)
    : embedding_(m.vocab_size, m.d_model), head_(m) {
  blocks_.reserve(static_cast<std::size_t>(m.n_layers));
  for (std::int64_t l = 0; l < m.n_layers; ++l)
    blocks_.emplace_back(m, l);
  if (m.mtp_depth > 0) mtp_.emplace(m);
}

std::vector<ParamSpec> Transformer::parameter_layout() const {
  std::vector<ParamSpec> specs;
  embedding_.declare(specs);
  for (const Block& b : blocks_)
    b.declare(specs);
  head_.declare(specs);
  if (mtp_) mtp_->declare(specs);
  return specs;
}

void Transformer::bind(const ParamStore& params) {
  embedding_.bind(params);
  for (Block& b : blocks_)
    b.bind(params);
  head_.bind(params);
  if (mtp_) mtp_->bind(params);
}

namespace {
void check_range(std::int64_t first, std::int64_t last, std::int64_t n, std::size_t acts) {
  if (first < 0 || first > last || last > n || static_cast<std::size_t>(last) > acts)
    throw Error("model: block range [" + std::to_string(first) + ", " + std::to_string(last) +
                ") is not within the " + std::to_string(n) + " blocks (" + std::to_string(acts) +
                " activation records)");
}
}  // namespace

void Transformer::forward_blocks(const Compute& c, const Rope& rope, std::int64_t B, std::int64_t T,
                                 const std::vector<BlockActs>& acts, std::int64_t first,
                                 std::int64_t last, const tensor::Tensor& out) const {
  check_range(first, last, n_blocks(), acts.size());
  for (std::int64_t l = first; l < last; ++l) {
    const auto i = static_cast<std::size_t>(l);
    blocks_[i].forward(c, rope, B, T, acts[i], l + 1 < last ? acts[i + 1].x : out);
  }
}

void Transformer::backward_blocks(const Compute& c, const Rope& rope, std::int64_t B,
                                  std::int64_t T, const std::vector<BlockActs>& acts,
                                  const BlockScratch& s, std::int64_t first, std::int64_t last,
                                  const tensor::Tensor& d_x, const OnReady& ready) const {
  check_range(first, last, n_blocks(), acts.size());
  for (std::int64_t l = last - 1; l >= first; --l) {
    const auto i = static_cast<std::size_t>(l);
    blocks_[i].backward(c, rope, B, T, acts[i], s, d_x, ready);
  }
}

std::vector<ParamSpec> dense_parameter_layout(const config::ModelSection& m) {
  return Transformer(m).parameter_layout();
}

}  // namespace dst::model
