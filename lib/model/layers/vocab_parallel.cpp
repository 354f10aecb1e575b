#include "model/layers/vocab_parallel.hpp"

#include <string>

#include "core/error.hpp"
#include "kernels/kernels.hpp"
#include "tensor/memory.hpp"

namespace dst::model {

namespace {

/// Throws unless `slice` is this rank's slice of a vocabulary split over `group`.
std::int64_t checked_vocab(const comm::Communicator& group, const VocabSlice& slice,
                           const char* what) {
  const std::int64_t v = slice.count * group.size();
  if (slice.count < 1 || slice.first != slice.count * group.rank() || slice.vocab != v)
    throw Error(std::string("model::") + what + ": the vocabulary slice [" +
                std::to_string(slice.first) + ", " + std::to_string(slice.first + slice.count) +
                ") is not rank " + std::to_string(group.rank()) +
                "'s slice of a vocabulary split over the " + std::to_string(group.size()) +
                " ranks of group \"" + group.name() + "\"");
  return v;
}

}  // namespace

VocabSlice VocabSlice::of(const std::int64_t vocab, const int rank, const int size) {
  if (size < 1 || rank < 0 || rank >= size || vocab < 1 || vocab % size != 0)
    throw Error("model::VocabSlice: a vocabulary of " + std::to_string(vocab) +
                " cannot be split evenly over " + std::to_string(size) + " ranks (rank " +
                std::to_string(rank) + ")");
  VocabSlice s;
  s.count = vocab / size;
  s.first = static_cast<std::int64_t>(rank) * s.count;
  s.vocab = vocab;
  return s;
}

VocabSlice VocabSlice::of_group(const std::int64_t vocab, const TensorParallel* group,
                                const int slices, const char* layer) {
  if (group == nullptr || group->size() != slices)
    throw Error(std::string("model: ") + layer + " was built for " + std::to_string(slices) +
                " tensor-parallel slices but computes without that tensor group");
  return of(vocab, group->rank(), slices);
}

void vocab_parallel_embedding_forward(const tensor::ExecContext& ctx, comm::Communicator& group,
                                      const VocabSlice& slice, const tensor::Tensor& tokens,
                                      const tensor::Tensor& table, const tensor::Tensor& out) {
  const std::int64_t v = checked_vocab(group, slice, "vocab_parallel_embedding_forward");
  kernels::embedding_slice_forward(ctx, tokens, table, slice.first, v, out);
  if (out.numel() == 0) return;  // every rank of the group has the same N: none communicates
  tensor::synchronize(ctx);
  group.allreduce(out.ptr<float>(), static_cast<std::size_t>(out.numel()), comm::ReduceOp::sum);
}

void vocab_parallel_embedding_scatter(const tensor::ExecContext& ctx, comm::Communicator& group,
                                      const VocabSlice& slice, const tensor::Tensor& tokens,
                                      const tensor::Tensor& table, const tensor::Tensor& whole,
                                      const tensor::Tensor& rows) {
  const std::int64_t n = tokens.numel();
  if (n % group.size() != 0)
    throw Error("model::vocab_parallel_embedding_scatter: " + std::to_string(n) +
                " token rows do not divide among the " + std::to_string(group.size()) +
                " ranks of group \"" + group.name() + "\"");
  const std::int64_t v = checked_vocab(group, slice, "vocab_parallel_embedding_scatter");
  kernels::embedding_slice_forward(ctx, tokens, table, slice.first, v, whole);
  if (n == 0) return;
  if (rows.numel() * group.size() != whole.numel())
    throw Error("model::vocab_parallel_embedding_scatter: rows " + rows.shape.str() +
                " are not 1/" + std::to_string(group.size()) + " of " + whole.shape.str());
  tensor::synchronize(ctx);
  group.reduce_scatter(whole.ptr<float>(), rows.ptr<float>(),
                       static_cast<std::size_t>(rows.numel()), DType::f32, comm::ReduceOp::sum);
}

void vocab_parallel_embedding_backward(const tensor::ExecContext& ctx, const VocabSlice& slice,
                                       const tensor::Tensor& tokens, const tensor::Tensor& dout,
                                       const tensor::Tensor& d_table) {
  kernels::embedding_slice_backward(ctx, tokens, dout, slice.first, slice.vocab, d_table);
}

void vocab_parallel_cross_entropy(const tensor::ExecContext& ctx, comm::Communicator& group,
                                  const VocabSlice& slice, const tensor::Tensor& logits,
                                  const tensor::Tensor& targets, const std::int32_t ignore_index,
                                  const float grad_scale, const bool with_gradient,
                                  const tensor::Tensor& losses,
                                  const CrossEntropyScratch& scratch) {
  const std::int64_t v = checked_vocab(group, slice, "vocab_parallel_cross_entropy");
  if (logits.shape.rank != 2 || logits.shape[1] != slice.count)
    throw Error("model::vocab_parallel_cross_entropy: logits " + logits.shape.str() +
                " are not (n, " + std::to_string(slice.count) + "), the slice's columns");
  // 1. The rows' maxima: the local ones, then their maximum over the group (as keys).
  kernels::cross_entropy_slice_max(ctx, logits, targets, ignore_index, v, scratch.keys);
  const std::int64_t n = logits.shape[0];
  if (n == 0) return;  // every rank of the group has the same n: none communicates
  tensor::synchronize(ctx);
  group.allreduce(scratch.keys.ptr<std::int32_t>(), static_cast<std::size_t>(n),
                  comm::ReduceOp::max);
  // 2. Per row the local sum of exp(l - max) and the target logit, summed over the group
  //    in one collective: (sum_0, target_0, sum_1, target_1, ...).
  kernels::cross_entropy_slice_sums(ctx, logits, scratch.keys, targets, ignore_index, slice.first,
                                    with_gradient, scratch.sums);
  tensor::synchronize(ctx);
  group.allreduce(scratch.sums.ptr<double>(), static_cast<std::size_t>(2 * n), comm::ReduceOp::sum);
  // 3. Losses on every rank; the gradient of the local columns.
  kernels::cross_entropy_slice_finish(ctx, logits, scratch.keys, scratch.sums, targets,
                                      ignore_index, slice.first, grad_scale, with_gradient, losses);
}

}  // namespace dst::model
