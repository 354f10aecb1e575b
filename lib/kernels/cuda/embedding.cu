// Token embedding on the GPU: a row gather forward; a backward that adds each vocabulary
// row's token rows in token order, exactly as the Kokkos back end does (the same float
// additions in the same order: bitwise equal results), without float atomics.
#include <cub/device/device_radix_sort.cuh>

#include <climits>
#include <string>

#include "core/error.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/detail/common.cuh"

namespace dst::kernels::cuda_backend {
namespace detail {
namespace {

/// Throws unless every token id is in [0, v): the Kokkos back end's message, with the first
/// bad position. `iota` as in first_bad_id.
void check_tokens(cudaStream_t stream, const char* kernel, const std::int32_t* tokens,
                  const Index n, const Index v, std::int32_t* iota, unsigned long long* flag,
                  void* host, const char* table = "the vocabulary") {
  const Index bad = first_bad_id(stream, tokens, n, v, false, 0, iota, flag, host);
  if (bad < 0) return;
  const std::int32_t id = id_at(stream, tokens, bad, host);
  throw Error(std::string("kernels::") + kernel + ": token id " + std::to_string(id) +
              " at position " + std::to_string(bad) + " is outside " + table + " [0, " +
              std::to_string(v) + ")");
}

/// out[n, :] = wte[tokens[n], :], one quad per thread.
template <bool kVec>
__global__ void gather_rows(const std::int32_t* tokens,  // (N)
                            const float* wte,            // (V, C)
                            float* out,                  // (N, C)
                            const Index n, const Index c) {
  const Index quads = ceil_div(c, 4);
  for (Index k = grid_start(); k < n * quads; k += grid_stride()) {
    const Index row = k / quads;
    const Index j = (k - row * quads) * 4;
    float v[4];
    load4<kVec>(wte + static_cast<Index>(tokens[row]) * c, j, c, v);
    store4<kVec>(out + row * c, j, c, v);
  }
}

/// Quads of dwte's columns per block of the backward (grid.y covers the rest of C).
constexpr int kRunThreads = 128;
/// Blocks over the sorted positions (grid.x); each strides over them. Any value gives the
/// same bits (a run is always summed whole by one thread per column); 1024 x (C / 512)
/// blocks keep an H200 busy for C >= 512.
constexpr Index kRunBlocks = 1024;

/// The tokens sorted stably (equal ids keep their position order) form runs, one per
/// distinct id. The thread owning columns [j, j + 4) of the run starting at sorted index i
/// computes dwte[id, j..] + dout[p_0, j..] + dout[p_1, j..] + ... over the run's positions
/// p_0 < p_1 < ... in a register and stores it once: Kokkos' order, no atomics.
template <bool kVec>
__global__ void accumulate_runs(const std::int32_t* sorted_ids,        // (N)
                                const std::int32_t* sorted_positions,  // (N)
                                const float* dout,                     // (N, C)
                                float* dwte,                           // (V, C)
                                const Index n, const Index c) {
  const Index j = (static_cast<Index>(blockIdx.y) * blockDim.x + threadIdx.x) * 4;
  if (j >= c) return;
  for (Index i = blockIdx.x; i < n; i += gridDim.x) {
    const std::int32_t id = sorted_ids[i];
    if (i > 0 && sorted_ids[i - 1] == id) continue;  // not the start of its run
    float* row = dwte + static_cast<Index>(id) * c;
    float acc[4];
    load4<kVec>(row, j, c, acc);
    for (Index k = i; k < n && sorted_ids[k] == id; ++k) {
      float d[4];
      load4<kVec>(dout + static_cast<Index>(sorted_positions[k]) * c, j, c, d);
#pragma unroll
      for (int q = 0; q < 4; ++q)
        acc[q] += d[q];
    }
    store4<kVec>(row, j, c, acc);
  }
}

/// Bits that hold every id in [0, v): the radix sort looks at no more.
int id_bits(const Index v) {
  int bits = 1;
  while (bits < 31 && (Index{1} << bits) < v)
    ++bits;
  return bits;
}

}  // namespace
}  // namespace detail

void run(void* stream, const kernels::detail::EmbeddingForwardArgs& a) {
  using namespace detail;
  const cudaStream_t s = stream_of(stream);
  ScratchLayout layout;
  const std::size_t flag_at = layout.add(sizeof(unsigned long long));
  const Scratch sc = scratch(s, layout.bytes());
  check_tokens(s, a.kernel, a.tokens, a.n, a.v, nullptr,
               reinterpret_cast<unsigned long long*>(sc.device + flag_at), sc.host, a.table);
  const bool vec = a.c % 4 == 0 && aligned16(a.wte) && aligned16(a.out);
  with_flag(vec, [&](auto kVec) {
    DST_CUDA_LAUNCH("dst::kernels::embedding_forward::gather", gather_rows<decltype(kVec)::value>,
                    element_grid(a.n * ceil_div(a.c, 4)), dim3(kElementThreads), s, a.tokens, a.wte,
                    a.out, a.n, a.c);
  });
}

void run(void* stream, const kernels::detail::EmbeddingBackwardArgs& a) {
  using namespace detail;
  const cudaStream_t s = stream_of(stream);
  // Positions are sorted as int32 values.
  if (a.n > INT_MAX)
    throw Error("kernels::embedding_backward: " + std::to_string(a.n) +
                " tokens exceed the CUDA back end's limit of 2^31 - 1 per call");
  const int n = static_cast<int>(a.n);
  const Index quads = ceil_div(a.c, 4);
  const Index column_blocks = ceil_div(quads, kRunThreads);
  if (column_blocks > 65535)
    throw Error("kernels::embedding_backward: C = " + std::to_string(a.c) +
                " exceeds the CUDA back end's grid limit");
  // Ids are in [0, v) once checked: sort them as unsigned (the same order, no sign bit).
  const auto* ids = reinterpret_cast<const std::uint32_t*>(a.tokens);
  const int end_bit = id_bits(a.v);
  std::size_t sort_bytes = 0;
  DST_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, sort_bytes, ids, static_cast<std::uint32_t*>(nullptr),
      static_cast<const std::int32_t*>(nullptr), static_cast<std::int32_t*>(nullptr), n, 0, end_bit,
      s));
  ScratchLayout layout;
  const std::size_t flag_at = layout.add(sizeof(unsigned long long));
  const std::size_t ids_at = layout.add(sizeof(std::uint32_t) * a.n);
  const std::size_t positions_at = layout.add(sizeof(std::int32_t) * a.n);
  const std::size_t sorted_positions_at = layout.add(sizeof(std::int32_t) * a.n);
  const std::size_t sort_at = layout.add(sort_bytes);
  const Scratch sc = scratch(s, layout.bytes());
  auto* sorted_ids = reinterpret_cast<std::uint32_t*>(sc.device + ids_at);
  auto* positions = reinterpret_cast<std::int32_t*>(sc.device + positions_at);
  auto* sorted_positions = reinterpret_cast<std::int32_t*>(sc.device + sorted_positions_at);

  // The check also writes positions[i] = i, the values the sort carries along.
  check_tokens(s, "embedding_backward", a.tokens, a.n, a.v, positions,
               reinterpret_cast<unsigned long long*>(sc.device + flag_at), sc.host);
  // LSD radix sort: stable, so each run lists its positions in increasing order.
  DST_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(sc.device + sort_at, sort_bytes, ids, sorted_ids,
                                                 positions, sorted_positions, n, 0, end_bit, s));
  const dim3 grid(static_cast<unsigned>(std::min(a.n, kRunBlocks)),
                  static_cast<unsigned>(column_blocks));
  const bool vec = a.c % 4 == 0 && aligned16(a.dout) && aligned16(a.dwte);
  with_flag(vec, [&](auto kVec) {
    DST_CUDA_LAUNCH("dst::kernels::embedding_backward::accumulate_runs",
                    accumulate_runs<decltype(kVec)::value>, grid, dim3(kRunThreads), s,
                    reinterpret_cast<const std::int32_t*>(sorted_ids), sorted_positions, a.dout,
                    a.dwte, a.n, a.c);
  });
}

}  // namespace dst::kernels::cuda_backend
