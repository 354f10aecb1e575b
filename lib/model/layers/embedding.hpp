#pragma once
/// \file embedding.hpp
/// The token embedding: row `token` of the (vocab, d_model) table for each token.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/layers/layer.hpp"
#include "model/layers/token_rows.hpp"
#include "model/layers/vocab_parallel.hpp"

namespace dst::model {

/// The table's parameter name (the head's too when the embeddings are tied).
inline constexpr const char* kEmbeddingTableName = "model.embed_tokens.weight";

class Embedding {
 public:
  /// `tensor_parallel` T: this rank holds vocab / T rows of the table, its slice
  /// (tensor_parallel.hpp); a token of another slice contributes zeros to its output
  /// before the group's sum. `row_split` (sequence parallelism: T): each rank keeps N / T
  /// rows of its output (token_rows.hpp).
  Embedding(std::int64_t vocab, std::int64_t dim, int tensor_parallel = 1, int row_split = 1);

  /// model.embed_tokens.weight (vocab, dim), split by vocabulary rows.
  void declare(std::vector<ParamSpec>& specs) const;
  void bind(const ParamStore& params);
  /// The table's parameter index (the head reads it when the embeddings are tied).
  std::size_t table() const { return table_; }

  /// out = this rank's rows of table[tokens] for tokens (N) i32: (N, dim), or (N / T, dim)
  /// under sequence parallelism, where the group's contributions are reduce-scattered
  /// (buf.gathered (N, dim) is scratch). Keeps nothing for backward but the tokens.
  void forward(const Compute& c, const tensor::Tensor& tokens, const tensor::Tensor& out,
               const RowBuffers& buf = {}) const;
  /// Accumulates dout (this rank's rows of d(loss)/d(out); under sequence parallelism
  /// gathered into buf.gathered first) into the table's gradient rows of `tokens`.
  void backward(const Compute& c, const tensor::Tensor& tokens, const tensor::Tensor& dout,
                const RowBuffers& buf = {}) const;

 private:
  /// This rank's rows under tensor parallelism (throws unless c has the tensor group).
  VocabSlice slice(const Compute& c) const;
  std::int64_t vocab_;  ///< the whole vocabulary
  std::int64_t dim_;
  int tp_;  ///< tensor-parallel slices of the table
  TokenRows rows_;
  std::size_t table_ = 0;
};

}  // namespace dst::model
