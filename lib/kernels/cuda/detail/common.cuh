#pragma once
/// \file common.cuh
/// What the CUDA kernels of this folder share: launch shapes, quad (float4) loads with a
/// scalar fallback that visits the same elements in the same order, fixed-order warp and
/// row reductions, and the token/target id check. Internal to kernels/cuda/.
///
/// Determinism: every launch shape below is a function of the tensor shapes only (never of
/// the device's SM count or of occupancy), every reduction combines its partial results in
/// a fixed tree, and no float atomics are used anywhere. So a kernel returns the same bits
/// on every run, on every GPU model that runs the same binary, and whether or not its
/// pointers are 16-byte aligned.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "core/error.hpp"
#include "kernels/cuda/detail/cuda_check.hpp"
#include "kernels/cuda/detail/math.cuh"
#include "kernels/cuda/detail/scratch.hpp"

namespace dst::kernels::cuda_backend::detail {

using Index = std::int64_t;

inline constexpr int kWarp = 32;
inline constexpr unsigned kAllLanes = 0xffffffffu;

inline cudaStream_t stream_of(void* stream) {
  return static_cast<cudaStream_t>(stream);
}

__host__ __device__ constexpr Index ceil_div(const Index a, const Index b) {
  return (a + b - 1) / b;
}

/// float4 loads and stores need 16-byte alignment; tensors from the arena have it, views
/// at odd offsets may not.
inline bool aligned16(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

// --- elementwise launch shape ------------------------------------------------------------
// 256 threads per block (8 warps: full occupancy on sm_90 at <= 32 registers per thread),
// grid-stride loops over the work, at most 65536 blocks (about 1000 per SM on a 132-SM
// H200, far beyond what is resident at once). Elementwise results do not depend on which
// thread computes which element, so these numbers only affect speed.
inline constexpr int kElementThreads = 256;
inline constexpr Index kMaxElementBlocks = 65536;

inline dim3 element_grid(const Index work) {
  return dim3(static_cast<unsigned>(std::min(ceil_div(work, kElementThreads), kMaxElementBlocks)));
}

/// First index and stride of a 1-D grid-stride loop, in 64 bits (N*V passes 2^31).
__device__ __forceinline__ Index grid_start() {
  return static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ Index grid_stride() {
  return static_cast<Index>(gridDim.x) * blockDim.x;
}

// --- quads ---------------------------------------------------------------------------------
// Rows and arrays are processed in quads of 4 consecutive floats: element 4q + k is always
// visited by the thread owning quad q, as its k-th element. With kVec a whole quad is one
// float4 access (the caller guarantees that p is 16-byte aligned; for rows of a matrix
// that means an aligned base and a row length that is a multiple of 4); a quad cut by
// `len`, and every quad without kVec, is four bounds-checked scalar accesses, and elements
// past `len` read as 0. Reductions therefore add the same terms in the same order on both
// paths, and the results do not depend on the pointers' alignment.

template <bool kVec>
__device__ __forceinline__ void load4(const float* p, const Index j, const Index len,
                                      float (&v)[4]) {
  if (kVec && j + 4 <= len) {
    const float4 q = *reinterpret_cast<const float4*>(p + j);
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k)
      v[k] = j + k < len ? p[j + k] : 0.0f;
  }
}

template <bool kVec>
__device__ __forceinline__ void store4(float* p, const Index j, const Index len,
                                       const float (&v)[4]) {
  if (kVec && j + 4 <= len) {
    *reinterpret_cast<float4*>(p + j) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (j + k < len) p[j + k] = v[k];
  }
}

// --- warp reductions -----------------------------------------------------------------------
// Butterfly (xor) shuffles: at every level a lane adds its partner's partial to its own and
// the partner does the reverse; IEEE addition is commutative, so all 32 lanes end with the
// same bits and the tree is fixed.

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(kAllLanes, v, offset);
  return v;
}

/// The Kokkos back end's max rule, `v > m ? v : m`: a NaN never wins (callers feed no NaN
/// partials: their own accumulation starts at -inf and uses the same rule). The rule is not
/// symmetric for -0 and +0, so lane 0's result is broadcast: every lane uses the same max.
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    const float o = __shfl_xor_sync(kAllLanes, v, offset);
    v = o > v ? o : v;
  }
  return __shfl_sync(kAllLanes, v, 0);
}

__device__ __forceinline__ unsigned long long warp_min(unsigned long long v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    const unsigned long long o = __shfl_xor_sync(kAllLanes, v, offset);
    v = o < v ? o : v;
  }
  return v;
}

// --- row groups ------------------------------------------------------------------------------
// Row kernels (RMSNorm, softmax, cross-entropy) give each row a group of kGroup threads
// (32, 128 or 512: group_for picks it from the row length alone) and pack 256 / kGroup
// rows into a block of at least 256 threads. Every thread of a block takes part in every
// group reduction, including threads whose row is past the end or has nothing to do (the
// reductions of groups wider than a warp use __syncthreads).

inline constexpr int kRowBlockMin = 256;

template <int kGroup>
struct RowGroup {
  static_assert(kGroup % kWarp == 0 && kGroup <= 1024, "a row group is whole warps");
  static constexpr int kBlock = kGroup < kRowBlockMin ? kRowBlockMin : kGroup;
  static constexpr int kRowsPerBlock = kBlock / kGroup;
  static constexpr int kWarpsPerGroup = kGroup / kWarp;
  static constexpr int kWarpsPerBlock = kBlock / kWarp;

  /// This thread's row, and its rank within the row's group.
  __device__ static Index row() {
    return static_cast<Index>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kGroup;
  }
  __device__ static int rank() { return static_cast<int>(threadIdx.x % kGroup); }

  /// Sum over the group: warp butterflies, then the group's warp totals added in warp
  /// order. `smem` holds kWarpsPerBlock entries; every thread of the block must call.
  __device__ static double sum(double v, double* smem) {
    v = warp_sum(v);
    if constexpr (kWarpsPerGroup == 1) {
      return v;
    } else {
      const int warp = static_cast<int>(threadIdx.x / kWarp);
      __syncthreads();  // an earlier reduction's reads of smem are done
      if (threadIdx.x % kWarp == 0) smem[warp] = v;
      __syncthreads();
      const int first = warp / kWarpsPerGroup * kWarpsPerGroup;
      double s = smem[first];
      for (int w = 1; w < kWarpsPerGroup; ++w)
        s += smem[first + w];
      return s;
    }
  }

  /// Max over the group, Kokkos' rule (warp_max).
  __device__ static float max(float v, float* smem) {
    v = warp_max(v);
    if constexpr (kWarpsPerGroup == 1) {
      return v;
    } else {
      const int warp = static_cast<int>(threadIdx.x / kWarp);
      __syncthreads();
      if (threadIdx.x % kWarp == 0) smem[warp] = v;
      __syncthreads();
      const int first = warp / kWarpsPerGroup * kWarpsPerGroup;
      float m = smem[first];
      for (int w = 1; w < kWarpsPerGroup; ++w) {
        const float o = smem[first + w];
        m = o > m ? o : m;
      }
      return m;
    }
  }
};

/// Threads per row for rows of `len` floats: about 8 quads (32 floats) per thread up to
/// 1024 quads; longer rows (the vocabulary, 1e5 logits) get 512 threads, whose blocks still
/// fit 4 per SM. A function of `len` only (determinism, above).
inline int group_for(const Index len) {
  const Index quads = ceil_div(len, 4);
  if (quads <= 8 * 32) return 32;
  if (quads <= 8 * 128) return 128;
  return 512;
}

/// Blocks for `rows` rows of a RowGroup<kGroup> kernel (throws past the grid's limit).
template <int kGroup>
dim3 row_grid(const Index rows, const char* kernel) {
  const Index blocks = ceil_div(rows, RowGroup<kGroup>::kRowsPerBlock);
  if (blocks > 0x7fffffff)
    throw Error(std::string("kernels::") + kernel + ": " + std::to_string(rows) +
                " rows exceed the CUDA grid limit");
  return dim3(static_cast<unsigned>(blocks));
}

/// Calls f(std::integral_constant<int, G>{}) for the row group size g (32, 128 or 512).
template <class F>
void with_group(const int g, F&& f) {
  switch (g) {
    case 32:
      f(std::integral_constant<int, 32>{});
      return;
    case 128:
      f(std::integral_constant<int, 128>{});
      return;
    default:
      f(std::integral_constant<int, 512>{});
      return;
  }
}

/// Calls f(std::true_type{}) or f(std::false_type{}): a run-time choice (the float4 path)
/// made a template argument, so each kernel body is compiled without the branch.
template <class F>
void with_flag(const bool b, F&& f) {
  if (b)
    f(std::true_type{});
  else
    f(std::false_type{});
}

// --- id checks (embedding tokens, cross-entropy targets) -------------------------------------

/// Position of the first id outside [0, v) that is not `ignore_index` (when allow_ignore),
/// or -1: a min over positions (an integer atomicMin per warp), so the answer does not
/// depend on the order. `flag` is 8 bytes of device scratch, `host` pinned scratch. When
/// `iota` is not null it also writes iota[i] = i (the embedding backward's sort values).
/// Synchronises the stream: the answer decides whether the kernels that index with the ids
/// may run at all.
Index first_bad_id(cudaStream_t stream, const std::int32_t* ids, Index n, Index v,
                   bool allow_ignore, std::int32_t ignore_index, std::int32_t* iota,
                   unsigned long long* flag, void* host);

/// ids[pos], read back (error path).
std::int32_t id_at(cudaStream_t stream, const std::int32_t* ids, Index pos, void* host);

}  // namespace dst::kernels::cuda_backend::detail
