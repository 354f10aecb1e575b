// A vocabulary split over a tensor-parallel group on the GPU: the embedding's gather and
// scatter-add on a slice of the table, and the cross-entropy's three passes on a slice of
// the logits. Straightforward kernels (a thread per output row or column) that follow the
// Kokkos back end (kokkos/vocab_slice.cpp) operation for operation, lane order included,
// so their results are its bits; the fast row-group forms of cross_entropy.cu are for
// the whole vocabulary.
#include <string>

#include "core/error.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/detail/common.cuh"

namespace dst::kernels::cuda_backend {
namespace detail {
namespace {

void check_ids(cudaStream_t stream, const char* kernel, const char* what, const std::int32_t* ids,
               const Index n, const Index v, const bool allow_ignore,
               const std::int32_t ignore_index) {
  ScratchLayout layout;
  const std::size_t flag_at = layout.add(sizeof(unsigned long long));
  const Scratch sc = scratch(stream, layout.bytes());
  const Index bad =
      first_bad_id(stream, ids, n, v, allow_ignore, ignore_index, nullptr,
                   reinterpret_cast<unsigned long long*>(sc.device + flag_at), sc.host);
  if (bad < 0) return;
  const std::int32_t id = id_at(stream, ids, bad, sc.host);
  throw Error(std::string("kernels::") + kernel + ": " + what + " " + std::to_string(id) +
              " at position " + std::to_string(bad) + " is outside the vocabulary [0, " +
              std::to_string(v) + ")" +
              (allow_ignore ? " and is not the ignore index " + std::to_string(ignore_index)
                            : std::string()));
}

__device__ __forceinline__ std::int32_t order_key(const std::int32_t bits) {
  return bits ^ ((bits >> 31) & 0x7fffffff);
}

__device__ __forceinline__ std::int32_t key_of(const float x) {
  return order_key(static_cast<std::int32_t>(math::float_bits(x)));
}

__device__ __forceinline__ float float_of(const std::int32_t key) {
  return math::bits_float(static_cast<std::uint32_t>(order_key(key)));
}

/// Kokkos' lane_sum: lane k sums j = k mod 8 in double, then the lanes pairwise.
template <class F>
__device__ __forceinline__ double lane_sum(const Index n, const F& f) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  Index j = 0;
  for (; j + 8 <= n; j += 8)
#pragma unroll
    for (int k = 0; k < 8; ++k)
      acc[k] += static_cast<double>(f(j + k));
  for (int k = 0; j < n; ++j, ++k)
    acc[k] += static_cast<double>(f(j));
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

__global__ void gather_slice(const std::int32_t* tokens, const float* wte, float* out,
                             const Index n, const Index c, const Index first, const Index count) {
  for (Index k = grid_start(); k < n * c; k += grid_stride()) {
    const Index i = k / c;
    const Index j = k - i * c;
    const Index row = static_cast<Index>(tokens[i]) - first;
    out[k] = row >= 0 && row < count ? wte[row * c + j] : -0.0f;
  }
}

/// A thread per column of dwte, the tokens in order: Kokkos' additions, no atomics.
__global__ void scatter_add_slice(const std::int32_t* tokens, const float* dout, float* dwte,
                                  const Index n, const Index c, const Index first,
                                  const Index count) {
  for (Index j = grid_start(); j < c; j += grid_stride())
    for (Index i = 0; i < n; ++i) {
      const Index row = static_cast<Index>(tokens[i]) - first;
      if (row >= 0 && row < count) dwte[row * c + j] += dout[i * c + j];
    }
}

__global__ void row_max_keys(const float* logits, std::int32_t* keys, const Index n,
                             const Index v) {
  for (Index i = grid_start(); i < n; i += grid_stride()) {
    const float* l = logits + i * v;
    std::int32_t m = key_of(math::negative_infinity());
    for (Index j = 0; j < v; ++j) {
      const std::int32_t k = key_of(l[j]);
      m = k > m ? k : m;
    }
    keys[i] = m;
  }
}

__global__ void row_sums(float* logits, const std::int32_t* keys, const std::int32_t* targets,
                         const std::int32_t ignore_index, const bool keep_exp, double* sums,
                         const Index n, const Index v, const Index first) {
  for (Index i = grid_start(); i < n; i += grid_stride()) {
    const std::int32_t t = targets[i];
    double* s = sums + 2 * i;
    if (t == ignore_index) {
      s[0] = s[1] = 0.0;
      continue;
    }
    float* l = logits + i * v;
    const Index at = static_cast<Index>(t) - first;
    s[1] = at >= 0 && at < v ? static_cast<double>(l[at]) : -0.0;
    const float m = float_of(keys[i]);
    if (keep_exp) {
      for (Index j = 0; j < v; ++j)
        l[j] = math::fast_exp(l[j] - m);
      s[0] = lane_sum(v, [&](const Index j) { return l[j]; });
    } else {
      s[0] = lane_sum(v, [&](const Index j) { return math::fast_exp(l[j] - m); });
    }
  }
}

__global__ void row_finish(float* logits, const std::int32_t* keys, const double* sums,
                           const std::int32_t* targets, const std::int32_t ignore_index,
                           const float grad_scale, const bool with_gradient, float* losses,
                           const Index n, const Index v, const Index first) {
  for (Index i = grid_start(); i < n; i += grid_stride()) {
    const std::int32_t t = targets[i];
    float* l = logits + i * v;
    if (t == ignore_index) {
      losses[i] = 0.0f;
      if (with_gradient)
        for (Index j = 0; j < v; ++j)
          l[j] = 0.0f;
      continue;
    }
    const double sum = sums[2 * i];
    const float m = float_of(keys[i]);
    losses[i] = static_cast<float>(log(sum) + static_cast<double>(m) - sums[2 * i + 1]);
    if (!with_gradient) continue;
    const float f = static_cast<float>(static_cast<double>(grad_scale) / sum);
    for (Index j = 0; j < v; ++j)
      l[j] = l[j] * f;
    const Index at = static_cast<Index>(t) - first;
    if (at >= 0 && at < v) l[at] -= grad_scale;
  }
}

}  // namespace
}  // namespace detail

void run(void* stream, const kernels::detail::EmbeddingSliceForwardArgs& a) {
  using namespace detail;
  const cudaStream_t s = stream_of(stream);
  check_ids(s, "embedding_slice_forward", "token id", a.tokens, a.n, a.v, false, 0);
  DST_CUDA_LAUNCH("dst::kernels::embedding_slice_forward::gather", gather_slice,
                  element_grid(a.n * a.c), dim3(kElementThreads), s, a.tokens, a.wte, a.out, a.n,
                  a.c, a.first, a.count);
}

void run(void* stream, const kernels::detail::EmbeddingSliceBackwardArgs& a) {
  using namespace detail;
  const cudaStream_t s = stream_of(stream);
  check_ids(s, "embedding_slice_backward", "token id", a.tokens, a.n, a.v, false, 0);
  DST_CUDA_LAUNCH("dst::kernels::embedding_slice_backward::scatter_add", scatter_add_slice,
                  element_grid(a.c), dim3(kElementThreads), s, a.tokens, a.dout, a.dwte, a.n, a.c,
                  a.first, a.count);
}

void run(void* stream, const kernels::detail::CrossEntropySliceMaxArgs& a) {
  using namespace detail;
  const cudaStream_t s = stream_of(stream);
  check_ids(s, "cross_entropy_slice_max", "target", a.targets, a.n, a.v, true, a.ignore_index);
  DST_CUDA_LAUNCH("dst::kernels::cross_entropy_slice_max::rows", row_max_keys, element_grid(a.n),
                  dim3(kElementThreads), s, a.logits, a.keys, a.n, a.count);
}

void run(void* stream, const kernels::detail::CrossEntropySliceSumsArgs& a) {
  using namespace detail;
  DST_CUDA_LAUNCH("dst::kernels::cross_entropy_slice_sums::rows", row_sums, element_grid(a.n),
                  dim3(kElementThreads), stream_of(stream), a.logits, a.keys, a.targets,
                  a.ignore_index, a.keep_exp, a.sums, a.n, a.count, a.first);
}

void run(void* stream, const kernels::detail::CrossEntropySliceFinishArgs& a) {
  using namespace detail;
  DST_CUDA_LAUNCH("dst::kernels::cross_entropy_slice_finish::rows", row_finish, element_grid(a.n),
                  dim3(kElementThreads), stream_of(stream), a.logits, a.keys, a.sums, a.targets,
                  a.ignore_index, a.grad_scale, a.with_gradient, a.losses, a.n, a.count, a.first);
}

}  // namespace dst::kernels::cuda_backend
