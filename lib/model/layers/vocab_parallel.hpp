#pragma once
/// \file vocab_parallel.hpp
/// Tensor parallelism over the vocabulary: the token embedding and the output
/// head's cross-entropy with their (V, C) tables split by rows over a tensor-parallel group
/// of P ranks, rank r owning vocabulary ids [r V/P, (r+1) V/P). Each is kernels on the
/// rank's slice (kernels.hpp, "vocabulary slices": the Kokkos reference and the CUDA back
/// end) and the group's collectives between them; every rank of the group calls them with
/// the same tokens, targets and sizes (the group's ranks see the same batch), so the
/// collectives match.
///
/// Arithmetic: the slice kernels follow kernels::cross_entropy_forward / _fused step for
/// step: the row maximum exact, exp by the kernels' fast_exp of l - max in float, the sum
/// of the exponentials in double in the kernels' lane order (8 interleaved partial sums,
/// then pairwise), loss = log(sum) + max - target logit in double, the gradient factor
/// float(grad_scale / sum). With a group of one rank the losses and gradient are therefore
/// the kernel's bits; with P ranks the only difference is the sum's order (each rank's
/// lane sum of its columns, then the sum of the P partial sums in the communicator's
/// order), a relative difference of a few double ulps in the sum, far below float
/// resolution (tests/mpi/model/vocab_parallel_test.cpp).
///
/// Every collective goes through the group's Communicator, so every wait has the group's
/// deadline and a hang names the operation and the group. The collectives read and write
/// the tensors where they are; the group's transport must reach that memory (host memory
/// over MPI).

#include <cstdint>

#include "comm/communicator.hpp"
#include "model/layers/tensor_parallel.hpp"
#include "tensor/context.hpp"
#include "tensor/tensor.hpp"

namespace dst::model {

/// A rank's slice of a vocabulary split over a tensor-parallel group of `size` ranks:
/// rows [first, first + count) of the (V, C) table; V % size == 0 (the deck guarantees
/// it), count = V / size, first = rank * count.
struct VocabSlice {
  std::int64_t first = 0, count = 0;
  std::int64_t vocab = 0;  ///< V, the whole vocabulary
  /// Throws dst::Error unless size >= 1, 0 <= rank < size, vocab >= 1 and size divides vocab.
  static VocabSlice of(std::int64_t vocab, int rank, int size);
  /// This rank's slice in `group` for a layer (`layer`: "the head", "the embedding") built
  /// for `slices` slices. Throws dst::Error when the layer computes without that tensor
  /// group (nullptr or another size).
  static VocabSlice of_group(std::int64_t vocab, const TensorParallel* group, int slices,
                             const char* layer);
  /// True when vocabulary id `id` is one of this slice's rows.
  bool holds(std::int64_t id) const { return id >= first && id < first + count; }
};

/// out (N, C) = the embedding rows of tokens (N) i32 from a table split by vocabulary:
/// this rank's rows `table` (slice.count, C) hold ids [slice.first, slice.first + count);
/// a token outside the slice contributes zeros (kernels::embedding_slice_forward); then
/// the sum over `group` (one allreduce, sum, f32) makes every rank's out the full
/// embedding. Exact, signed zeros included: the rows a rank does not hold contribute
/// -0.0, the identity of IEEE addition. Throws dst::Error naming the token and position
/// for an id outside [0, V), before any communication.
void vocab_parallel_embedding_forward(const tensor::ExecContext& ctx, comm::Communicator& group,
                                      const VocabSlice& slice, const tensor::Tensor& tokens,
                                      const tensor::Tensor& table, const tensor::Tensor& out);

/// The same under sequence parallelism: `whole` (N, C) receives this rank's contribution
/// and `rows` (N / size, C) the group's sum of rows [rank N / size, (rank + 1) N / size)
/// (one reduce-scatter instead of the all-reduce; the same bits). Throws dst::Error as
/// above, and when the group's size does not divide N.
void vocab_parallel_embedding_scatter(const tensor::ExecContext& ctx, comm::Communicator& group,
                                      const VocabSlice& slice, const tensor::Tensor& tokens,
                                      const tensor::Tensor& table, const tensor::Tensor& whole,
                                      const tensor::Tensor& rows);

/// d_table (slice.count, C) += the dout (N, C) rows of the tokens in this rank's slice,
/// accumulated in token order (kernels::embedding_slice_backward: the slices of all ranks
/// side by side are embedding_backward's bits on the full table); no communication.
/// Throws dst::Error naming an id outside [0, V) and its position.
void vocab_parallel_embedding_backward(const tensor::ExecContext& ctx, const VocabSlice& slice,
                                       const tensor::Tensor& tokens, const tensor::Tensor& dout,
                                       const tensor::Tensor& d_table);

/// The cross-entropy's per-row scratch, in the context's memory: keys (n) i32, the rows'
/// maxima; sums (n, 2) f64, their sums of exponentials and target logits.
struct CrossEntropyScratch {
  tensor::Tensor keys, sums;
};

/// Cross-entropy over logits split by vocabulary: `logits` (n, slice.count) are this
/// rank's columns [slice.first, + count) of the full (n, V) logits. losses (n) (written on
/// every rank) = logsumexp over the full row - full_logit[target], 0 where target ==
/// ignore_index. Never gathers the logits: two collectives a call, all rows batched:
///   1. allreduce(max) of the rows' local maxima (kernels::cross_entropy_slice_max, as
///      i32 order keys of the floats, so that the maximum is exactly the kernel's, NaN and
///      signed zeros included),
///   2. allreduce(sum) in double of, per row, the local sum of exp(l - global max) and
///      the target logit (cross_entropy_slice_sums: the owning rank contributes it, the
///      others -0.0: exact),
/// then cross_entropy_slice_finish. with_gradient: `logits` becomes d(grad_scale * sum of
/// losses) / d(logits) for the local columns, in place: grad_scale * (softmax -
/// onehot(target)), 0 for ignored rows. Throws dst::Error naming the target and its
/// position for a target outside [0, V) that is not ignore_index, before any
/// communication (as kernels::cross_entropy_*).
void vocab_parallel_cross_entropy(const tensor::ExecContext& ctx, comm::Communicator& group,
                                  const VocabSlice& slice, const tensor::Tensor& logits,
                                  const tensor::Tensor& targets, std::int32_t ignore_index,
                                  float grad_scale, bool with_gradient,
                                  const tensor::Tensor& losses, const CrossEntropyScratch& scratch);

}  // namespace dst::model
