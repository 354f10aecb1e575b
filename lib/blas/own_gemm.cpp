/// \file own_gemm.cpp
/// dstrain's own host SGEMM kernels (own_gemm.hpp): AVX-512 register tiles, and the two
/// drivers that feed them, small_gemm (attention) and blocked_gemm (the dense layers).
///
/// A tile computes R rows x 16 V columns of C in R x V accumulator registers (at most 24 of
/// the 32; the last 16-column vector of a row is masked when N ends inside it). For each p
/// it loads op(B)'s row p from a packed panel (V vectors) and broadcasts op(A)'s R elements
/// of column p, R x V fused multiply-adds in all, so each element's chain runs in ascending
/// p with nothing reordered. op(B) is always copied to panels of contiguous rows (packed_b);
/// op(A) is read where it lies, or (small_gemm, ta == yes) from a per-thread copy of A^T.
/// The code of this file that uses AVX-512 is only the functions marked DST_AVX512, and
/// they use no library templates (an inline function compiled for AVX-512 could be merged
/// with other translation units' copies and then run on a CPU without it).
#include "blas/own_gemm.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "core/error.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DST_OWN_GEMM_X86 1
#include <immintrin.h>
// prfchw: the write-intent prefetch of C (PREFETCHW, on every CPU with AVX-512F).
#define DST_AVX512 __attribute__((target("avx512f,prfchw")))
#else
#define DST_OWN_GEMM_X86 0
#endif

namespace dst::blas {
namespace {

#if DST_OWN_GEMM_X86

// GCC 12's avx512fintrin.h makes its "undefined" vectors as `__m512 __Y = __Y;`, and
// -Wuninitialized (-Wmaybe-uninitialized with the sanitizers) then warns in every function
// that inlines an intrinsic using one (unpacklo/hi, shuffle_f32x4; GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// small_gemm: tiles of 6 rows x 64 columns (24 accumulators), op(B) in 64-column panels,
// k in slices of 64 (run_small_tiles).
constexpr int kSmallRows = 6;
constexpr int kSmallPanel = 64;
constexpr std::int64_t kSmallDepth = 64;

// blocked_gemm: tiles of 12 rows x 32 columns (24 accumulators: 12 broadcasts of op(A) and
// 2 loads of op(B) per 24 multiply-adds), op(B) in 32-column panels. The loops (run_blocked):
// for each block of columns and of k, op(B) is packed once; then each row tile copies its
// 12 rows of op(A) (12 x 256 floats at most: 12 KiB of the 48 KiB L1 of current Intel
// cores) and passes over every panel of the block, whose rows stream from L2 (the
// arrangement of BLIS's x86 kernels, with the roles of A and B exchanged for row-major C).
// Blocks:
// - k in blocks of at most 256: products with K <= 256 (tiny's q, k, v, o, gate and up
//   forward) take one pass, so C is written once, never cleared first; a larger K takes a
//   few passes, each continuing the chains from C;
// - columns in blocks of at most 512: the packed block of op(B) (256 x 512 floats, 512 KiB)
//   stays in L2 (2 MiB per core) while all the row tiles pass over it.
// Each block size is balanced (blocks of equal size, rounded up to the panel), so that no
// block is a thin remainder. Measured against 512 x 512, 256 x 1024, 384 x 384 and 192 x
// 768 blocks (docs/performance.md, "dstrain's own kernels").
constexpr int kLayerRows = 12;
constexpr int kLayerPanel = 32;
constexpr std::int64_t kLayerDepth = 256;
constexpr std::int64_t kLayerBlockCols = 512;

/// What a tile reads and writes. op(A)[i][p] = a[i * lda + p]; or, for a tile instantiated
/// with kATrans (blocked_gemm's copy of A^T, pack_a_transposed), the tile of rows
/// [i0, i0 + 12) has its own block at a + i0 * k, where op(A)[i0 + r][p] is at p * lda + r.
/// op(B) in the current column block's panel, b pointing at its first row (row stride
/// kPanel); C[i][j] = c[i * ldc + j].
struct Operands {
  const float* a;
  std::int64_t lda;
  const float* b;
  float* c;
  std::int64_t ldc;
  std::int64_t k;
  bool accumulate;
  /// Where the next tile's C starts, in floats from this one's: prefetched for writing
  /// while this one computes (C of a dense layer comes from memory; attention's is small
  /// and cached: 0, no prefetch).
  std::int64_t next_c;
};

/// One tile: rows [i0, i0 + R) and columns [j0, j0 + 16 V), the last vector masked by `last`.
template <int R, int V, int kPanel, bool kATrans>
DST_AVX512 void tile(const Operands& o, std::int64_t i0, std::int64_t j0, __mmask16 last) {
  // Locals, not the struct's fields: GCC then keeps the accumulators in registers (with
  // the fields it stored all 24 to the stack on every p).
  const std::int64_t k = o.k, lda = o.lda, ldc = o.ldc;
  float* const c = o.c + i0 * ldc + j0;
  const float* a = kATrans ? o.a + i0 * k : o.a + i0 * lda;
  const float* b = o.b;
  __m512 acc[R][V];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      const __mmask16 m = v == V - 1 ? last : static_cast<__mmask16>(0xFFFF);
      acc[r][v] =
          o.accumulate ? _mm512_maskz_loadu_ps(m, c + r * ldc + 16 * v) : _mm512_setzero_ps();
    }
  if (o.next_c != 0) {
    // Past the end of C this is a hint about memory nobody reads: prefetches never fault.
    const char* next = reinterpret_cast<const char*>(c) + o.next_c * 4;
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v)
        __builtin_prefetch(next + (r * ldc + 16 * v) * 4, 1, 3);
  }
  for (std::int64_t p = 0; p < k; ++p) {
    __m512 bv[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v)
      bv[v] = v == V - 1 ? _mm512_maskz_loadu_ps(last, b + 16 * v) : _mm512_loadu_ps(b + 16 * v);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(kATrans ? a[r] : a[r * lda]);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v)
        acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
    }
    a += kATrans ? lda : 1;
    b += kPanel;
  }
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      const __mmask16 m = v == V - 1 ? last : static_cast<__mmask16>(0xFFFF);
      _mm512_mask_storeu_ps(c + r * ldc + 16 * v, m, acc[r][v]);
    }
}

using TileFn = void (*)(const Operands&, std::int64_t, std::int64_t, __mmask16);

template <int kPanel, bool kATrans, int V, std::size_t... I>
constexpr std::array<TileFn, sizeof...(I)> tiles_of_width(std::index_sequence<I...>) {
  return {&tile<static_cast<int>(I) + 1, V, kPanel, kATrans>...};
}

template <int kRows, int kPanel, bool kATrans, std::size_t... V>
constexpr std::array<std::array<TileFn, kRows>, sizeof...(V)> tile_table(
    std::index_sequence<V...>) {
  return {tiles_of_width<kPanel, kATrans, static_cast<int>(V) + 1>(
      std::make_index_sequence<kRows>{})...};
}

/// The tile of `rows` (1..kRows) x `vectors` (1..kPanel / 16) 16-float vectors.
template <int kRows, int kPanel, bool kATrans>
TileFn tile_fn(std::int64_t rows, int vectors) {
  static constexpr auto table =
      tile_table<kRows, kPanel, kATrans>(std::make_index_sequence<kPanel / 16>{});
  return table[static_cast<std::size_t>(vectors - 1)][static_cast<std::size_t>(rows - 1)];
}

/// Columns [j0, j0 + cols) of a panel: its vectors and the mask of the last one.
struct PanelColumns {
  int vectors;
  __mmask16 last;
  explicit PanelColumns(std::int64_t cols)
      : vectors(static_cast<int>((cols + 15) / 16)),
        last(static_cast<__mmask16>(
            cols - 16 * (vectors - 1) == 16 ? 0xFFFF : (1u << (cols - 16 * (vectors - 1))) - 1u)) {}
};

/// small_gemm's tiles; o.b: op(B) packed by packed_b (panels of kSmallPanel columns).
void run_small_tiles(const Operands& o, std::int64_t m, std::int64_t n) {
  for (std::int64_t j0 = 0; j0 < n; j0 += kSmallPanel) {
    const PanelColumns cols(std::min<std::int64_t>(kSmallPanel, n - j0));
    const TileFn full = tile_fn<kSmallRows, kSmallPanel, false>(kSmallRows, cols.vectors);
    const float* panel = o.b + j0 * o.k;  // (k x kSmallPanel), this column block's
    // k in slices of kSmallDepth rows of op(B) (kSmallDepth x 64 floats: 16 KiB, in L1 for
    // every tile of the column block). A later slice continues each element's chain from the
    // value the earlier one stored, so the order of the additions is unchanged.
    for (std::int64_t p0 = 0; p0 == 0 || p0 < o.k; p0 += kSmallDepth) {
      Operands s = o;
      s.a += p0;
      s.b = panel + p0 * kSmallPanel;
      s.k = std::min(kSmallDepth, o.k - p0);
      s.accumulate = o.accumulate || p0 > 0;
      std::int64_t i0 = 0;
      for (; i0 + kSmallRows <= m; i0 += kSmallRows)
        full(s, i0, j0, cols.last);
      if (i0 < m)
        tile_fn<kSmallRows, kSmallPanel, false>(m - i0, cols.vectors)(s, i0, j0, cols.last);
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

/// A per-thread copy of an operand: 64-byte aligned, so that every 64-byte row of a panel
/// (16 floats) is one cache line (std::vector's 16-byte alignment made every load of a
/// panel's row straddle two lines); grown on first use to the largest size and kept.
class Scratch {
 public:
  float* data() { return data_.get(); }
  void reserve(std::int64_t floats) {
    const auto want = static_cast<std::size_t>(floats);
    if (want <= size_) return;
    // aligned_alloc wants a size that is a multiple of the alignment.
    const std::size_t bytes = (want * sizeof(float) + 63) / 64 * 64;
    data_.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
    if (!data_)
      throw Error("blas::own_gemm: out of memory for a " + std::to_string(bytes) +
                  "-byte operand copy");
    size_ = want;
  }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float[], Free> data_;
  std::size_t size_ = 0;
};

/// X^T, X stored (n, k) with row stride ldb, copied to `buffer` as (k, n) row-major.
const float* transposed(Scratch& buffer, const float* b, std::int64_t ldb, std::int64_t n,
                        std::int64_t k) {
  buffer.reserve(n * k);
  transpose_into(b, ldb, n, k, buffer.data(), n);
  return buffer.data();
}

/// op(B) (k x n) copied to `buffer` in panels of `width` columns: panel q is columns
/// [width q, width q + width) as a (k x width) row-major block (the last one's columns
/// beyond n are never read: the tiles mask them). A tile then reads op(B) from one
/// contiguous slice whatever B's own layout: rows of B a multiple of 1 KiB apart (V, K, the
/// weights) would put a slice's rows into a quarter of L1's sets, where they evict each
/// other.
const float* packed_b(Scratch& buffer, Trans tb, const float* b, std::int64_t ldb, std::int64_t n,
                      std::int64_t k, std::int64_t width) {
  const std::int64_t panels = (n + width - 1) / width;
  buffer.reserve(panels * k * width);
  float* const out = buffer.data();
  if (tb == Trans::no) {
    // B's rows in order, each cut into its panels: B is read once, along its rows (panel by
    // panel it would be read in short pieces ldb apart, a stride the prefetchers miss).
    for (std::int64_t p = 0; p < k; ++p)
      for (std::int64_t j0 = 0; j0 < n; j0 += width)
        std::memcpy(out + j0 * k + p * width, b + p * ldb + j0,
                    static_cast<std::size_t>(std::min(width, n - j0)) * sizeof(float));
    return out;
  }
  for (std::int64_t j0 = 0; j0 < n; j0 += width)  // op(B)[p][j] = B[j][p]
    transpose_into(b + j0 * ldb, ldb, std::min(width, n - j0), k, out + j0 * k, width);
  return out;
}

/// The block size for `total` in blocks of at most `most`: the blocks equal, rounded up to
/// a multiple of `unit`.
std::int64_t balanced_block(std::int64_t total, std::int64_t most, std::int64_t unit) {
  const std::int64_t blocks = (total + most - 1) / most;
  const std::int64_t size = (total + blocks - 1) / blocks;
  return (size + unit - 1) / unit * unit;
}

/// The row stride, in floats, of a row tile's copy of op(A) whose rows are `kc` long: kc
/// rounded up to whole 64-byte lines, and to an odd number of them, so that the 12 rows a
/// tile broadcasts from lie in 12 different sets of L1 (in place, rows a power of two of
/// lines apart, as in A of 512 or 1024 columns, share two or four sets and evict each
/// other and the rows of op(B) streaming past).
std::int64_t packed_a_stride(std::int64_t kc) {
  const std::int64_t lines = (kc + 15) / 16;
  return 16 * (lines % 2 == 1 ? lines : lines + 1);
}

/// A row tile's op(A) = A's rows (ta == no), `rows` of them, each `kc` long, copied as rows
/// `stride` floats apart (packed_a_stride).
void pack_a_rows(const float* a, std::int64_t lda, std::int64_t rows, std::int64_t kc,
                 std::int64_t stride, float* dst) {
  for (std::int64_t i = 0; i < rows; ++i)
    std::memcpy(dst + i * stride, a + i * lda, static_cast<std::size_t>(kc) * sizeof(float));
}

/// op(A) = A^T (ta == yes) for `rows` rows (A's columns) over `kc` of k (A's rows), copied
/// as one block per 12-row tile: op(A)[t0 + r][p] at dst[t0 * kc + p * 12 + r], so that a
/// tile's broadcasts read one stream of 48 bytes per p (in place they would read one line
/// of A per p, lda apart). Row p of A is read once, in order, and goes out in 12-float
/// pieces, one to each tile's block.
DST_AVX512 void pack_a_transposed(const float* a, std::int64_t lda, std::int64_t rows,
                                  std::int64_t kc, float* dst) {
  for (std::int64_t p = 0; p < kc; ++p)
    for (std::int64_t t0 = 0; t0 < rows; t0 += kLayerRows) {
      const std::int64_t r = rows - t0 < kLayerRows ? rows - t0 : kLayerRows;
      const auto mask = static_cast<__mmask16>((1u << r) - 1u);
      _mm512_mask_storeu_ps(dst + t0 * kc + p * kLayerRows, mask,
                            _mm512_maskz_loadu_ps(mask, a + p * lda + t0));
    }
}

/// blocked_gemm for k > 0: for each column block and k block, op(B) packed once, and A^T
/// (ta == yes) too; then each row tile (its rows of A copied first when ta == no) passes
/// over every panel of the block.
void run_blocked(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                 std::int64_t lda, const float* b, std::int64_t ldb, bool accumulate, float* c,
                 std::int64_t ldc) {
  thread_local Scratch a_copy, b_panels;
  const std::int64_t kc_max = balanced_block(k, kLayerDepth, 1);
  const std::int64_t nc_max = balanced_block(n, kLayerBlockCols, kLayerPanel);
  const bool trans_a = ta == Trans::yes;
  const std::int64_t a_stride = packed_a_stride(kc_max);
  // A^T: the whole (m, kc) block, read along A's rows once (a tile's 12 columns of A are a
  // fraction of a cache line: copied tile by tile, each line of A would be read twice or
  // three times, lda apart); A: one tile's 12 rows at a time.
  a_copy.reserve(trans_a ? (m + kLayerRows - 1) / kLayerRows * kLayerRows * kc_max
                         : kLayerRows * a_stride);
  const auto tile_for = [trans_a](std::int64_t rows, int vectors) {
    return trans_a ? tile_fn<kLayerRows, kLayerPanel, true>(rows, vectors)
                   : tile_fn<kLayerRows, kLayerPanel, false>(rows, vectors);
  };
  for (std::int64_t jc = 0; jc < n; jc += nc_max) {
    const std::int64_t nc = std::min(nc_max, n - jc);
    for (std::int64_t pc = 0; pc < k; pc += kc_max) {
      const std::int64_t kc = std::min(kc_max, k - pc);
      // op(B)[pc + p][jc + j]: B[pc + p][jc + j], or B[jc + j][pc + p] when transposed.
      const float* panels =
          packed_b(b_panels, tb, tb == Trans::no ? b + pc * ldb + jc : b + jc * ldb + pc, ldb, nc,
                   kc, kLayerPanel);
      if (trans_a) pack_a_transposed(a + pc * lda, lda, m, kc, a_copy.data());
      for (std::int64_t i0 = 0; i0 < m; i0 += kLayerRows) {
        const std::int64_t rows = std::min<std::int64_t>(kLayerRows, m - i0);
        // A later k block continues each element's chain from the value the earlier one
        // stored: the order of the additions is that of one pass over k. The tile's copy of
        // A^T is its (kc, 12) block (o.lda: 12 floats from one p to the next).
        Operands o{trans_a ? a_copy.data() + i0 * kc : a_copy.data(),
                   trans_a ? kLayerRows : a_stride,
                   nullptr,
                   c + i0 * ldc,
                   ldc,
                   kc,
                   accumulate || pc > 0,
                   kLayerPanel};
        if (!trans_a) pack_a_rows(a + i0 * lda + pc, lda, rows, kc, a_stride, a_copy.data());
        for (std::int64_t j0 = 0; j0 < nc; j0 += kLayerPanel) {
          const PanelColumns cols(std::min<std::int64_t>(kLayerPanel, nc - j0));
          o.b = panels + j0 * kc;
          tile_for(rows, cols.vectors)(o, 0, jc + j0, cols.last);
        }
      }
    }
  }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#endif

}  // namespace

bool own_gemm_supported() {
#if DST_OWN_GEMM_X86
  static const bool supported = __builtin_cpu_supports("avx512f");
  return supported;
#else
  return false;
#endif
}

void small_gemm(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                std::int64_t lda, const float* b, std::int64_t ldb, bool accumulate, float* c,
                std::int64_t ldc) {
  if (!own_gemm_supported()) throw Error("blas::small_gemm: this CPU has no AVX-512F");
  if (m == 0 || n == 0) return;
#if DST_OWN_GEMM_X86
  // A transposed operand is copied to its plain layout first: B^T so that a tile loads
  // B's rows, A^T so that a tile's broadcasts read along rows (a column of a matrix whose
  // rows are a power of two apart, such as T x T probabilities, maps onto a few L1 sets).
  thread_local Scratch a_plain, b_panels;
  Operands o{a, lda, packed_b(b_panels, tb, b, ldb, n, k, kSmallPanel), c, ldc, k, accumulate, 0};
  if (ta == Trans::yes) {
    o.a = transposed(a_plain, a, lda, k, m);
    o.lda = k;
  }
  run_small_tiles(o, m, n);
#else
  (void)ta, (void)tb, (void)k, (void)a, (void)lda, (void)b, (void)ldb, (void)accumulate, (void)c,
      (void)ldc;
#endif
}

void blocked_gemm(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k,
                  const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                  bool accumulate, float* c, std::int64_t ldc) {
  if (!own_gemm_supported()) throw Error("blas::blocked_gemm: this CPU has no AVX-512F");
  if (m == 0 || n == 0) return;
  if (k == 0) {  // the empty sum: C = 0, or C unchanged
    if (!accumulate)
      for (std::int64_t i = 0; i < m; ++i)
        std::fill_n(c + i * ldc, n, 0.0F);
    return;
  }
#if DST_OWN_GEMM_X86
  run_blocked(ta, tb, m, n, k, a, lda, b, ldb, accumulate, c, ldc);
#else
  (void)ta, (void)tb, (void)a, (void)lda, (void)b, (void)ldb;
#endif
}

}  // namespace dst::blas
