#include "model/layers/vocab_parallel.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/error.hpp"
// The kernels' one definition of exp (and of the float bits), so that these losses are the
// cross-entropy kernel's bits: a header of inline functions without Kokkos.
#include "kernels/detail/fast_math.hpp"

namespace dst::model {

namespace {

namespace fm = ::dst::kernels::detail::fast_math;

/// An int32 whose signed order is the order of the floats (negative floats' magnitude bits
/// flipped): -inf < -x < -0 < +0 < x < +inf < NaN with the sign bit clear. An involution.
/// The key of kernels/kokkos/detail/common.hpp's row_max, so that the maximum over ranks
/// (a max of keys) is the kernel's maximum over the whole row.
std::int32_t order_key(const float x) {
  const auto bits = static_cast<std::int32_t>(fm::float_bits(x));
  return bits ^ ((bits >> 31) & 0x7fffffff);
}

float key_float(const std::int32_t key) {
  const std::int32_t bits = key ^ ((key >> 31) & 0x7fffffff);
  return fm::bits_float(static_cast<std::uint32_t>(bits));
}

/// sum_{j < n} x[j] in double in the kernels' lane order (kokkos/detail/common.hpp,
/// lane_sum): lane k sums j = k mod 8, then the lanes pairwise. The same order on one rank
/// is what makes a group of one the kernel's bits.
constexpr int kLanes = 8;
double lane_sum(const float* x, const std::int64_t n) {
  double acc[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int k = 0; k < kLanes; ++k)
      acc[k] += static_cast<double>(x[j + k]);
  for (int k = 0; j < n; ++j, ++k)
    acc[k] += static_cast<double>(x[j]);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/// Throws unless `slice` is this rank's slice of a vocabulary split over `group`.
std::int64_t checked_vocab(const comm::Communicator& group, const VocabSlice& slice,
                           const char* what) {
  const std::int64_t v = slice.count * group.size();
  if (slice.count < 1 || slice.first != slice.count * group.rank())
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
  return s;
}

VocabSlice VocabSlice::of_group(const std::int64_t vocab, const TensorParallel* group,
                                const int slices, const char* layer) {
  if (group == nullptr || group->size() != slices)
    throw Error(std::string("model: ") + layer + " was built for " + std::to_string(slices) +
                " tensor-parallel slices but computes without that tensor group");
  return of(vocab, group->rank(), slices);
}

namespace {
/// out (N, C): this rank's contribution to the embedding rows of `tokens` (its rows, -0.0
/// elsewhere), after checking every id; what = the caller's name for errors.
void embedding_contribution(const comm::Communicator& group, const VocabSlice& slice,
                            const std::int32_t* tokens, const std::int64_t n, const float* table,
                            const std::int64_t dim, float* out, const char* what) {
  const std::int64_t v = checked_vocab(group, slice, what);
  for (std::int64_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= v)
      throw Error(std::string("model::") + what + ": token id " + std::to_string(tokens[i]) +
                  " at position " + std::to_string(i) + " is outside the vocabulary [0, " +
                  std::to_string(v) + ")");
  const auto c = static_cast<std::size_t>(dim);
  for (std::int64_t i = 0; i < n; ++i) {
    float* dst = out + static_cast<std::size_t>(i) * c;
    if (slice.holds(tokens[i])) {
      std::memcpy(dst, table + static_cast<std::size_t>(tokens[i] - slice.first) * c,
                  c * sizeof(float));
    } else {
      // -0.0: x + (-0.0) == x for every x, +0.0 and -0.0 included, so the sum over the
      // group is the owner's row bit for bit.
      for (std::size_t j = 0; j < c; ++j)
        dst[j] = -0.0f;
    }
  }
}
}  // namespace

void vocab_parallel_embedding_forward(comm::Communicator& group, const VocabSlice& slice,
                                      const std::int32_t* tokens, const std::int64_t n,
                                      const float* table, const std::int64_t dim, float* out) {
  embedding_contribution(group, slice, tokens, n, table, dim, out,
                         "vocab_parallel_embedding_forward");
  if (n == 0) return;  // every rank of the group has the same n: none communicates
  group.allreduce(out, static_cast<std::size_t>(n * dim), comm::ReduceOp::sum);
}

void vocab_parallel_embedding_scatter(comm::Communicator& group, const VocabSlice& slice,
                                      const std::int32_t* tokens, const std::int64_t n,
                                      const float* table, const std::int64_t dim, float* whole,
                                      float* rows) {
  if (n % group.size() != 0)
    throw Error("model::vocab_parallel_embedding_scatter: " + std::to_string(n) +
                " token rows do not divide among the " + std::to_string(group.size()) +
                " ranks of group \"" + group.name() + "\"");
  embedding_contribution(group, slice, tokens, n, table, dim, whole,
                         "vocab_parallel_embedding_scatter");
  if (n == 0) return;
  group.reduce_scatter(whole, rows, static_cast<std::size_t>(n / group.size() * dim), DType::f32,
                       comm::ReduceOp::sum);
}

void vocab_parallel_embedding_backward(const VocabSlice& slice, const std::int32_t* tokens,
                                       const std::int64_t n, const float* dout,
                                       const std::int64_t dim, float* d_table) {
  const auto c = static_cast<std::size_t>(dim);
  for (std::int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0)
      throw Error("model::vocab_parallel_embedding_backward: token id " +
                  std::to_string(tokens[i]) + " at position " + std::to_string(i) + " is negative");
    if (!slice.holds(tokens[i])) continue;
    const float* src = dout + static_cast<std::size_t>(i) * c;
    float* dst = d_table + static_cast<std::size_t>(tokens[i] - slice.first) * c;
    for (std::size_t j = 0; j < c; ++j)
      dst[j] += src[j];
  }
}

void vocab_parallel_cross_entropy(comm::Communicator& group, const VocabSlice& slice, float* logits,
                                  const std::int64_t n, const std::int32_t* targets,
                                  const std::int32_t ignore_index, const float grad_scale,
                                  const bool with_gradient, float* losses) {
  const char* what = "vocab_parallel_cross_entropy";
  const std::int64_t v = checked_vocab(group, slice, what);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int32_t t = targets[i];
    if ((t < 0 || t >= v) && t != ignore_index)
      throw Error(std::string("model::") + what + ": target " + std::to_string(t) +
                  " at position " + std::to_string(i) + " is outside the vocabulary [0, " +
                  std::to_string(v) + ") and is not the ignore index " +
                  std::to_string(ignore_index));
  }
  if (n == 0) return;  // every rank of the group has the same n: none communicates
  const std::int64_t vl = slice.count;
  const auto row = [&](const std::int64_t i) { return logits + static_cast<std::size_t>(i * vl); };

  // 1. The rows' maxima: the local ones, then their maximum over the group (as keys).
  std::vector<std::int32_t> keys(static_cast<std::size_t>(n));  // (n)
  for (std::int64_t i = 0; i < n; ++i) {
    const float* l = row(i);
    std::int32_t m = order_key(-std::numeric_limits<float>::infinity());
    for (std::int64_t j = 0; j < vl; ++j) {
      const std::int32_t k = order_key(l[j]);
      m = k > m ? k : m;
    }
    keys[static_cast<std::size_t>(i)] = m;
  }
  group.allreduce(keys.data(), keys.size(), comm::ReduceOp::max);

  // 2. Per row the local sum of exp(l - max) and the target logit, summed over the group
  //    in one collective: (sum_0, target_0, sum_1, target_1, ...). The target logit is
  //    read before the exponentials overwrite the row.
  std::vector<double> sums(2 * static_cast<std::size_t>(n));  // (n, 2)
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int32_t t = targets[i];
    double* s = &sums[2 * static_cast<std::size_t>(i)];
    if (t == ignore_index) {
      s[0] = s[1] = 0.0;
      continue;
    }
    float* l = row(i);
    s[1] = slice.holds(t) ? static_cast<double>(l[t - slice.first]) : -0.0;
    const float m = key_float(keys[static_cast<std::size_t>(i)]);
    if (with_gradient) {
      for (std::int64_t j = 0; j < vl; ++j)
        l[j] = fm::fast_exp(l[j] - m);
      s[0] = lane_sum(l, vl);
    } else {
      // As the kernel's forward: the exponentials summed as they are computed.
      double acc[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
      std::int64_t j = 0;
      for (; j + kLanes <= vl; j += kLanes)
        for (int k = 0; k < kLanes; ++k)
          acc[k] += static_cast<double>(fm::fast_exp(l[j + k] - m));
      for (int k = 0; j < vl; ++j, ++k)
        acc[k] += static_cast<double>(fm::fast_exp(l[j] - m));
      s[0] = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    }
  }
  group.allreduce(sums.data(), sums.size(), comm::ReduceOp::sum);

  // 3. Losses on every rank; the gradient of the local columns.
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int32_t t = targets[i];
    float* l = row(i);
    if (t == ignore_index) {
      losses[i] = 0.0f;
      if (with_gradient)
        for (std::int64_t j = 0; j < vl; ++j)
          l[j] = 0.0f;
      continue;
    }
    const double sum = sums[2 * static_cast<std::size_t>(i)];
    const double target_logit = sums[2 * static_cast<std::size_t>(i) + 1];
    const float m = key_float(keys[static_cast<std::size_t>(i)]);
    losses[i] = static_cast<float>(std::log(sum) + static_cast<double>(m) - target_logit);
    if (with_gradient) {
      // softmax * grad_scale in one factor; sum >= 1 (the max's term is exp(0)).
      const float f = static_cast<float>(static_cast<double>(grad_scale) / sum);
      for (std::int64_t j = 0; j < vl; ++j)
        l[j] = l[j] * f;
      if (slice.holds(t)) l[t - slice.first] -= grad_scale;
    }
  }
}

}  // namespace dst::model
