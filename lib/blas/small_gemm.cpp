/// \file small_gemm.cpp
/// The attention products' host kernel (small_gemm.hpp): an AVX-512 register-blocked
/// product without OpenBLAS's per-call packing of both operands and clearing of C.
///
/// C is computed in tiles of 6 rows x 64 columns (24 accumulator registers; the last
/// 16-column vector of a row is masked when N is not a multiple of 16, rows beyond M use a
/// smaller tile). For each p, the tile loads op(B)'s row p (4 vectors) and broadcasts
/// op(A)'s 6 elements of column p, 24 fused multiply-adds in all, so each element's chain
/// runs in ascending p with nothing reordered. op(B) is copied once per call to per-thread
/// panels of 64 columns (packed_b); op(A) is read where it lies, or from a per-thread
/// copy of A^T when ta == yes. Both copies are small here (head_dim x T floats).
/// The code of this file that uses AVX-512 is only the functions marked DST_AVX512, and
/// they use no library templates (an inline function compiled for AVX-512 could be merged
/// with other translation units' copies and then run on a CPU without it).
#include "blas/small_gemm.hpp"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

#include "core/error.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DST_SMALL_GEMM_X86 1
#include <immintrin.h>
#define DST_AVX512 __attribute__((target("avx512f")))
#else
#define DST_SMALL_GEMM_X86 0
#endif

namespace dst::blas {
namespace {

#if DST_SMALL_GEMM_X86

// GCC 12's avx512fintrin.h makes its "undefined" vectors as `__m512 __Y = __Y;`, and
// -Wuninitialized (-Wmaybe-uninitialized with the sanitizers) then warns in every function
// that inlines an intrinsic using one (unpacklo/hi, shuffle_f32x4; GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

constexpr int kRows = 6;     // tile rows: accumulators = kRows x kVectors <= 24 of 32
constexpr int kVectors = 4;  // 16-float vectors per tile row: 64 columns
constexpr int kCols = 16 * kVectors;
constexpr std::int64_t kDepth = 64;  // k per pass over the tiles (see run_tiles)

/// Where the operands lie: op(A)[i][p] = a[i * lda + p] (A itself, or the copy of A^T);
/// op(B) in packed_b's panels, b pointing at the current panel slice (row stride kCols);
/// C[i][j] = c[i * ldc + j].
struct Operands {
  const float* a;
  std::int64_t lda;
  const float* b;
  float* c;
  std::int64_t ldc;
  std::int64_t k;
  bool accumulate;
};

/// One tile: rows [i0, i0 + R) and columns [j0, j0 + 16 V), the last vector masked by `last`.
template <int R, int V>
DST_AVX512 void tile(const Operands& o, std::int64_t i0, std::int64_t j0, __mmask16 last) {
  // Locals, not the struct's fields: GCC then keeps the accumulators in registers (with
  // the fields it stored all 24 to the stack on every p).
  const std::int64_t k = o.k, lda = o.lda, ldc = o.ldc;
  float* const c = o.c + i0 * ldc + j0;
  const float* a = o.a + i0 * lda;
  const float* b = o.b;  // run_tiles points it at the column block's packed panel
  __m512 acc[R][V];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      const __mmask16 m = v == V - 1 ? last : static_cast<__mmask16>(0xFFFF);
      acc[r][v] =
          o.accumulate ? _mm512_maskz_loadu_ps(m, c + r * ldc + 16 * v) : _mm512_setzero_ps();
    }
  for (std::int64_t p = 0; p < k; ++p) {
    __m512 bv[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v)
      bv[v] = v == V - 1 ? _mm512_maskz_loadu_ps(last, b + 16 * v) : _mm512_loadu_ps(b + 16 * v);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(a[r * lda]);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v)
        acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
    }
    ++a;
    b += kCols;
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      const __mmask16 m = v == V - 1 ? last : static_cast<__mmask16>(0xFFFF);
      _mm512_mask_storeu_ps(c + r * ldc + 16 * v, m, acc[r][v]);
    }
}

using TileFn = void (*)(const Operands&, std::int64_t, std::int64_t, __mmask16);

template <int R>
constexpr TileFn tile_of_width(int v) {
  return v == 1 ? &tile<R, 1> : v == 2 ? &tile<R, 2> : v == 3 ? &tile<R, 3> : &tile<R, 4>;
}

TileFn tile_fn(int rows, int vectors) {
  switch (rows) {
    case 1:
      return tile_of_width<1>(vectors);
    case 2:
      return tile_of_width<2>(vectors);
    case 3:
      return tile_of_width<3>(vectors);
    case 4:
      return tile_of_width<4>(vectors);
    case 5:
      return tile_of_width<5>(vectors);
    default:
      return tile_of_width<6>(vectors);
  }
}

/// o.b: op(B) packed by packed_b (panels of kCols columns, row stride kCols).
void run_tiles(const Operands& o, std::int64_t m, std::int64_t n) {
  for (std::int64_t j0 = 0; j0 < n; j0 += kCols) {
    const std::int64_t cols = std::min<std::int64_t>(kCols, n - j0);
    const int vectors = static_cast<int>((cols + 15) / 16);
    const int tail = static_cast<int>(cols - 16 * (vectors - 1));  // 1..16
    const auto last = static_cast<__mmask16>(tail == 16 ? 0xFFFF : (1u << tail) - 1u);
    const TileFn full = tile_fn(kRows, vectors);
    const float* panel = o.b + j0 * o.k;  // (k x kCols), this column block's
    // k in slices of kDepth rows of op(B) (kDepth x 64 floats: 16 KiB, in L1 for every
    // tile of the column block). A later slice continues each element's chain from the
    // value the earlier one stored, so the order of the additions is unchanged.
    for (std::int64_t p0 = 0; p0 == 0 || p0 < o.k; p0 += kDepth) {
      Operands s = o;
      s.a += p0;
      s.b = panel + p0 * kCols;
      s.k = std::min(kDepth, o.k - p0);
      s.accumulate = o.accumulate || p0 > 0;
      std::int64_t i0 = 0;
      for (; i0 + kRows <= m; i0 += kRows)
        full(s, i0, j0, last);
      if (i0 < m) tile_fn(static_cast<int>(m - i0), vectors)(s, i0, j0, last);
    }
  }
}

/// t (16 x 16, row stride ldt) = s^T (s: 16 x 16, row stride lds), in registers: the
/// usual three rounds of unpack and lane shuffles.
DST_AVX512 void transpose16(const float* s, std::int64_t lds, float* t, std::int64_t ldt) {
  __m512 r[16], u[16];
  for (int i = 0; i < 16; ++i)
    r[i] = _mm512_loadu_ps(s + i * lds);
  for (int i = 0; i < 16; i += 2) {
    u[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    u[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    const __m512d a = _mm512_castps_pd(u[i]), b = _mm512_castps_pd(u[i + 1]);
    const __m512d c = _mm512_castps_pd(u[i + 2]), d = _mm512_castps_pd(u[i + 3]);
    r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  // r[4q + w] now holds, in each 128-bit lane l, column 4l + (w order) of rows 4q..4q+3.
  for (int i = 0; i < 4; ++i) {
    u[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
    u[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xDD);
    u[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
    u[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xDD);
  }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_f32x4(u[i], u[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(u[i], u[i + 8], 0xDD);
  }
  for (int i = 0; i < 16; ++i)
    _mm512_storeu_ps(t + i * ldt, r[i]);
}

/// dst (cols x rows, row stride ldd) = src^T, src (rows x cols, row stride lds): 16 x 16
/// blocks in registers, the edges element by element.
void transpose_into(const float* src, std::int64_t lds, std::int64_t rows, std::int64_t cols,
                    float* dst, std::int64_t ldd) {
  constexpr std::int64_t kBlock = 16;
  for (std::int64_t i0 = 0; i0 < rows; i0 += kBlock)
    for (std::int64_t j0 = 0; j0 < cols; j0 += kBlock) {
      const std::int64_t i1 = std::min(rows, i0 + kBlock), j1 = std::min(cols, j0 + kBlock);
      if (i1 - i0 == kBlock && j1 - j0 == kBlock) {
        transpose16(src + i0 * lds + j0, lds, dst + j0 * ldd + i0, ldd);
        continue;
      }
      for (std::int64_t j = j0; j < j1; ++j)
        for (std::int64_t i = i0; i < i1; ++i)
          dst[j * ldd + i] = src[i * lds + j];
    }
}

/// X^T, X stored (n, k) with row stride ldb, copied to `buffer` as (k, n) row-major.
const float* transposed(std::vector<float>& buffer, const float* b, std::int64_t ldb,
                        std::int64_t n, std::int64_t k) {
  buffer.resize(static_cast<std::size_t>(n * k));
  transpose_into(b, ldb, n, k, buffer.data(), n);
  return buffer.data();
}

/// op(B) (k x n) copied to `buffer` in panels of kCols columns: panel q is columns
/// [64 q, 64 q + 64) as a (k x 64) row-major block (the last one's columns beyond n are
/// never read: the tiles mask them). A tile then reads op(B) from one contiguous 16 KiB
/// slice whatever B's own layout: rows of B a multiple of 1 KiB apart (V, K, the weights)
/// would put a slice's 64 rows into a quarter of L1's sets, where they evict each other.
const float* packed_b(std::vector<float>& buffer, Trans tb, const float* b, std::int64_t ldb,
                      std::int64_t n, std::int64_t k) {
  const std::int64_t panels = (n + kCols - 1) / kCols;
  buffer.resize(static_cast<std::size_t>(panels * k * kCols));
  for (std::int64_t q = 0; q < panels; ++q) {
    const std::int64_t j0 = q * kCols, cols = std::min<std::int64_t>(kCols, n - j0);
    float* panel = buffer.data() + j0 * k;
    if (tb == Trans::no) {
      for (std::int64_t p = 0; p < k; ++p)
        std::memcpy(panel + p * kCols, b + p * ldb + j0, static_cast<std::size_t>(cols) * 4);
      continue;
    }
    transpose_into(b + j0 * ldb, ldb, cols, k, panel, kCols);  // op(B)[p][j] = B[j][p]
  }
  return buffer.data();
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#endif

}  // namespace

bool small_gemm_supported() {
#if DST_SMALL_GEMM_X86
  static const bool supported = __builtin_cpu_supports("avx512f");
  return supported;
#else
  return false;
#endif
}

void small_gemm(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                std::int64_t lda, const float* b, std::int64_t ldb, bool accumulate, float* c,
                std::int64_t ldc) {
  if (!small_gemm_supported()) throw Error("blas::small_gemm: this CPU has no AVX-512F");
  if (m == 0 || n == 0) return;
#if DST_SMALL_GEMM_X86
  // A transposed operand is copied to its plain layout first: B^T so that a tile loads
  // B's rows, A^T so that a tile's broadcasts read along rows (a column of a matrix whose
  // rows are a power of two apart, such as T x T probabilities, maps onto a few L1 sets).
  thread_local std::vector<float> a_plain, b_panels;
  Operands o{a, lda, packed_b(b_panels, tb, b, ldb, n, k), c, ldc, k, accumulate};
  if (ta == Trans::yes) {
    o.a = transposed(a_plain, a, lda, k, m);
    o.lda = k;
  }
  run_tiles(o, m, n);
#else
  (void)ta, (void)tb, (void)k, (void)a, (void)lda, (void)b, (void)ldb, (void)accumulate, (void)c,
      (void)ldc;
#endif
}

}  // namespace dst::blas
