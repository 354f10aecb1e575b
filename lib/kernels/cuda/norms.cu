// Gradient clipping's kernels on the GPU: the sum of squares (the norm) in double with a
// fixed reduction tree, the non-finite search as a min reduction, and the in-place scale.
#include <climits>

#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/detail/common.cuh"

namespace dst::kernels::cuda_backend {
namespace detail {
namespace {

// The sum's tree: at most kSquaresBlocks blocks of kSquaresThreads threads (fewer for
// small tensors, a function of n only); thread g of the grid adds the squares of quads g,
// g + G, g + 2G, ... (G threads in the grid) in one double chain; each block adds its 256
// chains in a fixed butterfly-then-warp-order tree; one block adds the block sums the same
// way. 1024 x 256 threads fill an H200 (2048 resident threads on each of 132 SMs) and the
// 1024 partials (8 KiB) fit in the scratch's smallest block.
constexpr int kSquaresThreads = 256;
constexpr Index kSquaresBlocks = 1024;

template <bool kVec>
__global__ void __launch_bounds__(kSquaresThreads) squares_partials(const float* x,  // (n)
                                                                    const Index n,
                                                                    double* partials) {  // (blocks)
  __shared__ double smem[kSquaresThreads / kWarp];
  double acc = 0.0;
  for (Index q = grid_start(); q < ceil_div(n, 4); q += grid_stride()) {
    float v[4];
    load4<kVec>(x, 4 * q, n, v);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      // A float's square is exact in double (24 + 24 < 53 bits): only the sum rounds.
      const double d = v[k];
      acc += d * d;
    }
  }
  acc = RowGroup<kSquaresThreads>::sum(acc, smem);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

constexpr int kFinishThreads = static_cast<int>(kSquaresBlocks);

__global__ void __launch_bounds__(kFinishThreads)
    squares_finish(const double* partials,  // (count)
                   const Index count, double* result) {
  __shared__ double smem[kFinishThreads / kWarp];
  const double v = threadIdx.x < count ? partials[threadIdx.x] : 0.0;
  const double total = RowGroup<kFinishThreads>::sum(v, smem);
  if (threadIdx.x == 0) *result = total;
}

/// The smallest index whose bits are NaN or Inf (math::nonfinite_bits: no floating-point
/// comparison), by an integer atomicMin per warp: the answer does not depend on the order.
template <bool kVec>
__global__ void find_nonfinite(const float* x,  // (n)
                               const Index n, const unsigned long long offset,
                               unsigned long long* first) {
  unsigned long long local = ULLONG_MAX;
  for (Index q = grid_start(); q < ceil_div(n, 4); q += grid_stride()) {
    float v[4];
    load4<kVec>(x, 4 * q, n, v);  // past n: 0, finite
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const auto j = static_cast<unsigned long long>(4 * q + k);
      if (math::nonfinite_bits(v[k]) && j < local) local = j;
    }
  }
  local = warp_min(local);
  if (threadIdx.x % kWarp == 0 && local != ULLONG_MAX) atomicMin(first, offset + local);
}

template <bool kVec>
__global__ void scale_elements(float* x, const float factor, const Index n) {
  for (Index q = grid_start(); q < ceil_div(n, 4); q += grid_stride()) {
    float v[4];
    load4<kVec>(x, 4 * q, n, v);
#pragma unroll
    for (int k = 0; k < 4; ++k)
      v[k] *= factor;
    store4<kVec>(x, 4 * q, n, v);
  }
}

/// Enqueues the sum of squares of x (n) into result (device memory); partials from scratch
/// (stream-ordered: the next call's kernels reuse it only after this call's have run).
void enqueue_sum_of_squares(const cudaStream_t s, const float* x, const Index n, double* result,
                            const Scratch& sc, const std::size_t partials_at) {
  if (n == 0) {
    DST_CUDA_CHECK(cudaMemsetAsync(result, 0, sizeof *result, s));  // all-zero bits: +0.0
    return;
  }
  const Index blocks = std::min(kSquaresBlocks, ceil_div(ceil_div(n, 4), kSquaresThreads));
  auto* partials = reinterpret_cast<double*>(sc.device + partials_at);
  with_flag(aligned16(x), [&](auto kVec) {
    DST_CUDA_LAUNCH("dst::kernels::sum_of_squares::partials",
                    squares_partials<decltype(kVec)::value>, dim3(static_cast<unsigned>(blocks)),
                    dim3(kSquaresThreads), s, x, n, partials);
  });
  DST_CUDA_LAUNCH("dst::kernels::sum_of_squares::finish", squares_finish, dim3(1),
                  dim3(kFinishThreads), s, partials, blocks, result);
}

}  // namespace
}  // namespace detail

void run(void* stream, const kernels::detail::SumOfSquaresArgs& a) {
  using namespace detail;
  const cudaStream_t s = stream_of(stream);
  ScratchLayout layout;
  const std::size_t partials_at = layout.add(sizeof(double) * kSquaresBlocks);
  const std::size_t result_at = layout.add(sizeof(double));
  const Scratch sc = scratch(s, layout.bytes());
  auto* result = reinterpret_cast<double*>(sc.device + result_at);
  enqueue_sum_of_squares(s, a.x, a.n, result, sc, partials_at);
  auto* host = static_cast<double*>(sc.host);
  DST_CUDA_CHECK(cudaMemcpyAsync(host, result, sizeof *host, cudaMemcpyDeviceToHost, s));
  DST_CUDA_CHECK(cudaStreamSynchronize(s));
  *a.result = *host;
}

void run(void* stream, const kernels::detail::SumOfSquaresIntoArgs& a) {
  using namespace detail;
  const cudaStream_t s = stream_of(stream);
  ScratchLayout layout;
  const std::size_t partials_at = layout.add(sizeof(double) * kSquaresBlocks);
  enqueue_sum_of_squares(s, a.x, a.n, a.out, scratch(s, layout.bytes()), partials_at);
}

void run(void* stream, const kernels::detail::FirstNonfiniteArgs& a) {
  using namespace detail;
  const cudaStream_t s = stream_of(stream);
  ScratchLayout layout;
  const std::size_t flag_at = layout.add(sizeof(unsigned long long));
  const Scratch sc = scratch(s, layout.bytes());
  auto* flag = reinterpret_cast<unsigned long long*>(sc.device + flag_at);
  DST_CUDA_CHECK(cudaMemsetAsync(flag, 0xff, sizeof *flag, s));  // ULLONG_MAX: none
  with_flag(aligned16(a.x), [&](auto kVec) {
    DST_CUDA_LAUNCH("dst::kernels::first_nonfinite::elements",
                    find_nonfinite<decltype(kVec)::value>, element_grid(ceil_div(a.n, 4)),
                    dim3(kElementThreads), s, a.x, a.n, 0ull, flag);
  });
  auto* host = static_cast<unsigned long long*>(sc.host);
  DST_CUDA_CHECK(cudaMemcpyAsync(host, flag, sizeof *host, cudaMemcpyDeviceToHost, s));
  DST_CUDA_CHECK(cudaStreamSynchronize(s));
  *a.result = *host == ULLONG_MAX ? -1 : static_cast<Index>(*host);
}

void run(void* stream, const kernels::detail::FirstNonfiniteMinArgs& a) {
  using namespace detail;
  const cudaStream_t s = stream_of(stream);
  auto* flag = reinterpret_cast<unsigned long long*>(a.flag);
  static_assert(sizeof(unsigned long long) == sizeof(std::uint64_t));
  with_flag(aligned16(a.x), [&](auto kVec) {
    DST_CUDA_LAUNCH("dst::kernels::first_nonfinite_min::elements",
                    find_nonfinite<decltype(kVec)::value>, element_grid(ceil_div(a.n, 4)),
                    dim3(kElementThreads), s, a.x, a.n, static_cast<unsigned long long>(a.offset),
                    flag);
  });
}

void run(void* stream, const kernels::detail::ScaleArgs& a) {
  using namespace detail;
  with_flag(aligned16(a.x), [&](auto kVec) {
    DST_CUDA_LAUNCH("dst::kernels::scale::elements", scale_elements<decltype(kVec)::value>,
                    element_grid(ceil_div(a.n, 4)), dim3(kElementThreads), stream_of(stream), a.x,
                    a.factor, a.n);
  });
}

}  // namespace dst::kernels::cuda_backend
