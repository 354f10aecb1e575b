#pragma once
/// \file vocab_parallel.hpp
/// Tensor parallelism over the vocabulary: the token embedding and the output
/// head's cross-entropy with their (V, C) tables split by rows over a tensor-parallel group
/// of P ranks, rank r owning vocabulary ids [r V/P, (r+1) V/P). Host functions over
/// row-major f32 arrays; every rank of the group calls them with the same tokens, targets
/// and sizes (the group's ranks see the same batch), so the collectives match.
///
/// Arithmetic: the cross-entropy follows kernels::cross_entropy_forward / _fused (the Kokkos
/// kernel, lib/kernels/kokkos/cross_entropy.cpp) step for step: the row maximum exact, exp
/// by the kernels' fast_exp of l - max in float, the sum of the exponentials in double in
/// the kernels' lane order (8 interleaved partial sums, then pairwise), loss = log(sum) +
/// max - target logit in double, the gradient factor float(grad_scale / sum). With a group
/// of one rank the losses and gradient are therefore the kernel's bits; with P ranks the
/// only difference is the sum's order (each rank's lane sum of its columns, then the sum of
/// the P partial sums in the communicator's order), a relative difference of a few double
/// ulps in the sum, far below float resolution (tests/mpi/model/vocab_parallel_test.cpp).
///
/// Every collective goes through the group's Communicator, so every wait has the group's
/// deadline and a hang names the operation and the group.

#include <cstdint>

#include "comm/communicator.hpp"
#include "model/layers/tensor_parallel.hpp"

namespace dst::model {

/// A rank's slice of a vocabulary split over a tensor-parallel group of `size` ranks:
/// rows [first, first + count) of the (V, C) table; V % size == 0 (the deck guarantees
/// it), count = V / size, first = rank * count.
struct VocabSlice {
  std::int64_t first = 0, count = 0;
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

/// out (N, C) = the embedding rows of tokens (N) from a table split by vocabulary: this
/// rank's rows `table` (slice.count, C) hold ids [slice.first, slice.first + count); a
/// token outside the slice contributes zeros; then the sum over `group` (one allreduce,
/// sum, f32) makes every rank's out the full embedding. Exact, signed zeros included: the
/// rows a rank does not hold contribute -0.0, the identity of IEEE addition.
/// Throws dst::Error naming the token and position for an id outside [0, V)
/// (V = slice.count * group.size()), before any communication.
void vocab_parallel_embedding_forward(comm::Communicator& group, const VocabSlice& slice,
                                      const std::int32_t* tokens,  // (N)
                                      std::int64_t n,
                                      const float* table,  // (slice.count, C)
                                      std::int64_t dim,
                                      float* out);  // (N, C)

/// The same under sequence parallelism: `whole` (N, C) receives this rank's contribution
/// and `rows` (N / size, C) the group's sum of rows [rank N / size, (rank + 1) N / size)
/// (one reduce-scatter instead of the all-reduce; the same bits). Throws dst::Error as
/// above, and when the group's size does not divide N.
void vocab_parallel_embedding_scatter(comm::Communicator& group, const VocabSlice& slice,
                                      const std::int32_t* tokens,  // (N)
                                      std::int64_t n,
                                      const float* table,  // (slice.count, C)
                                      std::int64_t dim,
                                      float* whole,  // (N, C) scratch
                                      float* rows);  // (N / group.size(), C)

/// d_table (slice.count, C) += the dout rows of the tokens in this rank's slice,
/// accumulated in token order (as kernels::embedding_backward: the slices of all ranks
/// side by side are its bits on the full table); no communication. Tokens outside the
/// slice are skipped (another rank's rows); a negative id throws dst::Error naming it and
/// its position (the forward has checked the upper bound against V).
void vocab_parallel_embedding_backward(const VocabSlice& slice,
                                       const std::int32_t* tokens,  // (N)
                                       std::int64_t n,
                                       const float* dout,  // (N, C)
                                       std::int64_t dim,
                                       float* d_table);  // (slice.count, C)

/// Cross-entropy over logits split by vocabulary: `logits` (n, slice.count) are this
/// rank's columns [slice.first, + count) of the full (n, V) logits. losses[i] (written on
/// every rank) = logsumexp over the full row - full_logit[target], 0 where target ==
/// ignore_index. Never gathers the logits: two collectives a call, all rows batched:
///   1. allreduce(max) of the rows' local maxima (as i32 order keys of the floats, so that
///      the maximum is exactly the kernel's, NaN and signed zeros included),
///   2. allreduce(sum) in double of, per row, the local sum of exp(l - global max) and
///      the target logit (the owning rank contributes it, the others -0.0: exact).
/// with_gradient: `logits` becomes d(grad_scale * sum of losses) / d(logits) for the local
/// columns, in place: grad_scale * (softmax - onehot(target)), 0 for ignored rows.
/// Throws dst::Error naming the target and its position for a target outside [0, V) that
/// is not ignore_index, before any communication (as kernels::cross_entropy_*).
void vocab_parallel_cross_entropy(comm::Communicator& group, const VocabSlice& slice,
                                  float* logits,  // (n, slice.count)
                                  std::int64_t n,
                                  const std::int32_t* targets,  // (n)
                                  std::int32_t ignore_index, float grad_scale, bool with_gradient,
                                  float* losses);  // (n)

}  // namespace dst::model
