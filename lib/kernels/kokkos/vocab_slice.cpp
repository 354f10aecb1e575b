// A vocabulary split over a tensor-parallel group: the embedding's gather and scatter-add
// on a slice of the table, and the cross-entropy's three passes on a slice of the logits
// (the group's collectives run between them, model/layers/vocab_parallel.cpp). Each
// follows the whole-vocabulary kernel (embedding.cpp, cross_entropy.cpp) operation for
// operation, so that a group of one gives its bits.
#include <limits>
#include <string>

#include "kernels/kokkos/detail/common.hpp"
#include "kernels/kokkos/kokkos_backend.hpp"

namespace dst::kernels::kokkos_backend {
namespace detail {
namespace {

namespace fm = ::dst::kernels::detail::fast_math;

template <class ExecSpace>
void check_ids(const ExecSpace& space, const char* kernel, const char* what,
               const Vector<ExecSpace, const std::int32_t>& ids, const Index v,
               const bool allow_ignore, const std::int32_t ignore_index) {
  const std::string op = std::string("dst::kernels::") + kernel;
  const Index bad = first_bad_id(space, op + "::check_ids", ids, v, allow_ignore, ignore_index);
  if (bad < 0) return;
  const std::int32_t id = id_at(space, op + "::read_bad_id", ids, bad);
  throw Error(std::string("kernels::") + kernel + ": " + what + " " + std::to_string(id) +
              " at position " + std::to_string(bad) + " is outside the vocabulary [0, " +
              std::to_string(v) + ")" +
              (allow_ignore ? " and is not the ignore index " + std::to_string(ignore_index)
                            : std::string()));
}

KOKKOS_INLINE_FUNCTION std::int32_t key_of(const float x) {
  return float_order_key(static_cast<std::int32_t>(fm::float_bits(x)));
}

KOKKOS_INLINE_FUNCTION float float_of(const std::int32_t key) {
  return fm::bits_float(static_cast<std::uint32_t>(float_order_key(key)));
}

}  // namespace
}  // namespace detail

using Space = Kokkos::DefaultExecutionSpace;

void run(const kernels::detail::EmbeddingSliceForwardArgs& a) {
  using namespace detail;
  const Space space;
  const Vector<Space, const std::int32_t> tokens(a.tokens, a.n);
  check_ids(space, "embedding_slice_forward", "token id", tokens, a.v, false, 0);
  const Matrix<Space, const float> wte(a.wte, a.count, a.c);
  const Matrix<Space, float> out(a.out, a.n, a.c);
  const Index c = a.c, first = a.first, count = a.count;
  Kokkos::parallel_for(
      "dst::kernels::embedding_slice_forward::gather", Range<Space>(space, 0, a.n),
      KOKKOS_LAMBDA(const Index n) {
        const Index row = static_cast<Index>(tokens(n)) - first;
        float* dst = &out(n, 0);
        if (row >= 0 && row < count) {
          const float* src = &wte(row, 0);
          for (Index j = 0; j < c; ++j)
            dst[j] = src[j];
        } else {
          // -0.0: x + (-0.0) == x for every x, +0.0 and -0.0 included, so the group's sum
          // is the owner's row bit for bit.
          for (Index j = 0; j < c; ++j)
            dst[j] = -0.0f;
        }
      });
}

void run(const kernels::detail::EmbeddingSliceBackwardArgs& a) {
  using namespace detail;
  const Space space;
  const Vector<Space, const std::int32_t> tokens(a.tokens, a.n);
  check_ids(space, "embedding_slice_backward", "token id", tokens, a.v, false, 0);
  const Matrix<Space, const float> dout(a.dout, a.n, a.c);
  const Matrix<Space, float> dwte(a.dwte, a.count, a.c);
  const Index n_tok = a.n, c = a.c, first = a.first, count = a.count;
  // As embedding_backward: a block of columns per work item, the tokens in order.
  constexpr Index kBlock = column_block<Space>();
  const Index blocks = (c + kBlock - 1) / kBlock;
  Kokkos::parallel_for(
      "dst::kernels::embedding_slice_backward::scatter_add", Range<Space>(space, 0, blocks),
      KOKKOS_LAMBDA(const Index blk) {
        const Index j0 = blk * kBlock;
        const Index width = c - j0 < kBlock ? c - j0 : kBlock;
        for (Index n = 0; n < n_tok; ++n) {
          const Index row = static_cast<Index>(tokens(n)) - first;
          if (row < 0 || row >= count) continue;  // another rank's row
          const float* src = &dout(n, j0);
          float* dst = &dwte(row, j0);
          for (Index j = 0; j < width; ++j)
            dst[j] += src[j];
        }
      });
}

void run(const kernels::detail::CrossEntropySliceMaxArgs& a) {
  using namespace detail;
  const Space space;
  const Vector<Space, const std::int32_t> targets(a.targets, a.n);
  check_ids(space, "cross_entropy_slice_max", "target", targets, a.v, true, a.ignore_index);
  const Matrix<Space, const float> logits(a.logits, a.n, a.count);
  const Vector<Space, std::int32_t> keys(a.keys, a.n);
  const Index v = a.count;
  Kokkos::parallel_for(
      "dst::kernels::cross_entropy_slice_max::rows", Range<Space>(space, 0, a.n),
      KOKKOS_LAMBDA(const Index n) {
        const float* l = &logits(n, 0);
        std::int32_t m = key_of(-std::numeric_limits<float>::infinity());
        for (Index j = 0; j < v; ++j) {
          const std::int32_t k = key_of(l[j]);
          m = k > m ? k : m;
        }
        keys(n) = m;
      });
}

void run(const kernels::detail::CrossEntropySliceSumsArgs& a) {
  using namespace detail;
  const Space space;
  const Matrix<Space, float> logits(a.logits, a.n, a.count);
  const Vector<Space, const std::int32_t> keys(a.keys, a.n);
  const Vector<Space, const std::int32_t> targets(a.targets, a.n);
  const Matrix<Space, double> sums(a.sums, a.n, 2);
  const Index v = a.count, first = a.first;
  const std::int32_t ignore_index = a.ignore_index;
  const bool keep_exp = a.keep_exp;
  Kokkos::parallel_for(
      "dst::kernels::cross_entropy_slice_sums::rows", Range<Space>(space, 0, a.n),
      KOKKOS_LAMBDA(const Index n) {
        const std::int32_t t = targets(n);
        if (t == ignore_index) {
          sums(n, 0) = sums(n, 1) = 0.0;
          return;
        }
        float* l = &logits(n, 0);
        const Index at = static_cast<Index>(t) - first;
        // The target's logit before the exponentials overwrite the row.
        sums(n, 1) = at >= 0 && at < v ? static_cast<double>(l[at]) : -0.0;
        const float m = float_of(keys(n));
        if (keep_exp) {
          for (Index j = 0; j < v; ++j)
            l[j] = math::fast_exp(l[j] - m);
          sums(n, 0) = lane_sum(v, [&](const Index j) { return l[j]; });
        } else {
          sums(n, 0) = lane_sum(v, [&](const Index j) { return math::fast_exp(l[j] - m); });
        }
      });
}

void run(const kernels::detail::CrossEntropySliceFinishArgs& a) {
  using namespace detail;
  const Space space;
  const Matrix<Space, float> logits(a.logits, a.n, a.count);
  const Vector<Space, const std::int32_t> keys(a.keys, a.n);
  const Matrix<Space, const double> sums(a.sums, a.n, 2);
  const Vector<Space, const std::int32_t> targets(a.targets, a.n);
  const Vector<Space, float> losses(a.losses, a.n);
  const Index v = a.count, first = a.first;
  const std::int32_t ignore_index = a.ignore_index;
  const float grad_scale = a.grad_scale;
  const bool with_gradient = a.with_gradient;
  Kokkos::parallel_for(
      "dst::kernels::cross_entropy_slice_finish::rows", Range<Space>(space, 0, a.n),
      KOKKOS_LAMBDA(const Index n) {
        const std::int32_t t = targets(n);
        float* l = &logits(n, 0);
        if (t == ignore_index) {
          losses(n) = 0.0f;
          if (with_gradient)
            for (Index j = 0; j < v; ++j)
              l[j] = 0.0f;
          return;
        }
        const double sum = sums(n, 0);
        const float m = float_of(keys(n));
        losses(n) = static_cast<float>(math::log(sum) + static_cast<double>(m) - sums(n, 1));
        if (!with_gradient) return;
        // softmax * grad_scale in one factor; sum >= 1 (the max's term is exp(0)).
        const float f = static_cast<float>(static_cast<double>(grad_scale) / sum);
        for (Index j = 0; j < v; ++j)
          l[j] = l[j] * f;
        const Index at = static_cast<Index>(t) - first;
        if (at >= 0 && at < v) l[at] -= grad_scale;
      });
}

}  // namespace dst::kernels::kokkos_backend
