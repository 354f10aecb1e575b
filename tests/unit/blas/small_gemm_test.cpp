// blas::small_gemm, the attention products' own kernel: the exact bits of a scalar chain of
// fused multiply-adds in ascending k, for every transpose, tile edge and stride; padding
// between rows untouched; and what it computes when accumulating.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "blas/gemm.hpp"
#include "blas/small_gemm.hpp"
#include "error_of.hpp"

namespace {

using dst::blas::Trans;

constexpr float kPad = 12345.0F;

struct Case {
  Trans ta, tb;
  std::int64_t m, n, k;
  bool accumulate;
};

std::string name_of(const Case& c) {
  return std::string(c.ta == Trans::no ? "N" : "T") + (c.tb == Trans::no ? "N" : "T") + " " +
         std::to_string(c.m) + "x" + std::to_string(c.n) + "x" + std::to_string(c.k) +
         (c.accumulate ? " +=" : "");
}

// A stored matrix rows x cols with row stride cols + 3, the padding set to kPad.
struct Stored {
  std::int64_t rows, cols, ld;
  std::vector<float> v;
  Stored(std::int64_t r, std::int64_t c, std::mt19937& gen)
      : rows(r), cols(c), ld(c + 3), v(static_cast<std::size_t>(r * (c + 3)), kPad) {
    std::uniform_real_distribution<float> dist(-1.0F, 1.0F);
    for (std::int64_t i = 0; i < r; ++i)
      for (std::int64_t j = 0; j < c; ++j)
        v[static_cast<std::size_t>(i * ld + j)] = dist(gen);
  }
  float at(std::int64_t i, std::int64_t j) const { return v[static_cast<std::size_t>(i * ld + j)]; }
};

class SmallGemm : public ::testing::Test {
 protected:
  void SetUp() override {
    // A CPU without AVX-512F runs the attention products in OpenBLAS (gemm_test covers it).
    if (!dst::blas::small_gemm_supported())
      GTEST_SKIP() << "this CPU has no AVX-512F: attention products use OpenBLAS";
  }
};

void check_case(const Case& cs, std::mt19937& gen) {
  SCOPED_TRACE(name_of(cs));
  const Stored a(cs.ta == Trans::no ? cs.m : cs.k, cs.ta == Trans::no ? cs.k : cs.m, gen);
  const Stored b(cs.tb == Trans::no ? cs.k : cs.n, cs.tb == Trans::no ? cs.n : cs.k, gen);
  Stored c(cs.m, cs.n, gen);
  const Stored c0 = c;
  dst::blas::small_gemm(cs.ta, cs.tb, cs.m, cs.n, cs.k, a.v.data(), a.ld, b.v.data(), b.ld,
                        cs.accumulate, c.v.data(), c.ld);
  for (std::int64_t i = 0; i < cs.m; ++i) {
    for (std::int64_t j = 0; j < c.ld; ++j) {
      if (j >= cs.n) {
        ASSERT_EQ(c.at(i, j), kPad) << "padding written at row " << i << ", column " << j;
        continue;
      }
      float acc = cs.accumulate ? c0.at(i, j) : 0.0F;
      for (std::int64_t p = 0; p < cs.k; ++p)
        acc = std::fma(cs.ta == Trans::no ? a.at(i, p) : a.at(p, i),
                       cs.tb == Trans::no ? b.at(p, j) : b.at(j, p), acc);
      std::uint32_t want = 0, got = 0;
      std::memcpy(&want, &acc, 4);
      const float out = c.at(i, j);
      std::memcpy(&got, &out, 4);
      ASSERT_EQ(got, want) << "C[" << i << "][" << j << "] = " << out << ", the fma chain gives "
                           << acc;
    }
  }
}

TEST_F(SmallGemm, EqualsTheScalarFmaChainBitForBit) {
  std::mt19937 gen(7);
  // Rows around the 6-row tile, columns around the 16-float vector and the 64-column tile,
  // the attention shapes (64-row query blocks, head_dim 64, up to 4 blocks of keys).
  const std::int64_t rows[] = {1, 5, 6, 7, 13, 64};
  const std::int64_t cols[] = {1, 15, 16, 17, 63, 64, 65, 130};
  const std::int64_t depths[] = {0, 1, 3, 64, 100};
  for (Trans ta : {Trans::no, Trans::yes})
    for (Trans tb : {Trans::no, Trans::yes})
      for (bool accumulate : {false, true})
        for (std::int64_t m : rows)
          for (std::int64_t n : cols)
            for (std::int64_t k : depths)
              check_case({ta, tb, m, n, k, accumulate}, gen);
  for (std::int64_t r1 : {64, 128, 192, 256}) {  // tiny's attention products at T = 256
    check_case({Trans::no, Trans::yes, 64, r1, 64, false}, gen);  // scores
    check_case({Trans::no, Trans::no, 64, 64, r1, false}, gen);   // P x V, d_q
    check_case({Trans::yes, Trans::no, r1, 64, 64, true}, gen);   // d_v, d_k
  }
}

TEST_F(SmallGemm, EmptyProductsTouchNothingAndKZeroWritesZeros) {
  std::vector<float> a(16, 1.0F), b(16, 1.0F), c(16, 3.0F);
  dst::blas::small_gemm(Trans::no, Trans::no, 0, 4, 4, a.data(), 4, b.data(), 4, false, c.data(),
                        4);
  dst::blas::small_gemm(Trans::no, Trans::no, 4, 0, 4, a.data(), 4, b.data(), 4, false, c.data(),
                        4);
  for (float x : c)
    EXPECT_EQ(x, 3.0F);
  dst::blas::small_gemm(Trans::no, Trans::no, 4, 4, 0, a.data(), 4, b.data(), 4, true, c.data(), 4);
  for (float x : c)
    EXPECT_EQ(x, 3.0F);
  dst::blas::small_gemm(Trans::no, Trans::no, 4, 4, 0, a.data(), 4, b.data(), 4, false, c.data(),
                        4);
  for (float x : c)
    EXPECT_EQ(x, 0.0F);
}

// The batched entry the model calls: matrix i is small_gemm of matrix i (the same bits), the
// gaps between C matrices are untouched.
TEST_F(SmallGemm, BatchedEntryRunsEachMatrixThroughTheKernel) {
  std::mt19937 gen(11);
  const std::int64_t m = 13, n = 70, k = 33, batch = 3;
  const Stored a(batch * m, k, gen), b(batch * n, k, gen);  // NT, as the attention scores
  Stored c(batch * (m + 1), n, gen);                        // one padding row between Cs
  const Stored c0 = c;
  dst::blas::small_gemm_strided_batched({}, Trans::no, Trans::yes, m, n, k, a.v.data(), a.ld,
                                        m * a.ld, b.v.data(), b.ld, n * b.ld, true, c.v.data(),
                                        c.ld, (m + 1) * c.ld, batch);
  for (std::int64_t i = 0; i < batch; ++i) {
    Stored want(m, n, gen);
    for (std::int64_t r = 0; r < m; ++r)
      for (std::int64_t j = 0; j < n; ++j)
        want.v[static_cast<std::size_t>(r * want.ld + j)] = c0.at(i * (m + 1) + r, j);
    dst::blas::small_gemm(Trans::no, Trans::yes, m, n, k, a.v.data() + i * m * a.ld, a.ld,
                          b.v.data() + i * n * b.ld, b.ld, true, want.v.data(), want.ld);
    for (std::int64_t r = 0; r < m; ++r)
      for (std::int64_t j = 0; j < n; ++j)
        ASSERT_EQ(c.at(i * (m + 1) + r, j), want.at(r, j))
            << "batch " << i << " C[" << r << "][" << j << "]";
    for (std::int64_t j = 0; j < n; ++j)
      ASSERT_EQ(c.at(i * (m + 1) + m, j), c0.at(i * (m + 1) + m, j)) << "gap after batch " << i;
  }
}

// Checked before any kernel runs, with or without AVX-512, under the entry's own name.
TEST(SmallGemmErrors, NameTheCallAndTheBadValue) {
  using dst::test::error_of;
  std::vector<float> a(16), b(16), c(16);
  const auto has = [](const std::string& msg, std::initializer_list<const char*> parts) {
    for (const char* p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' in: " << msg;
  };
  has(error_of([&] {
        dst::blas::small_gemm_strided_batched({}, Trans::no, Trans::no, 2, 2, 4, a.data(), 3, 8,
                                              b.data(), 2, 8, false, c.data(), 2, 4, 1);
      }),
      {"blas::small_gemm_strided_batched", "lda = 3", "row length 4", "A"});
  has(error_of([&] {
        dst::blas::small_gemm_strided_batched({}, Trans::no, Trans::no, 2, 2, 2, a.data(), 2, 4,
                                              b.data(), 2, 4, false, c.data(), 2, 3, 2);
      }),
      {"blas::small_gemm_strided_batched", "stride_c = 3", "overlap"});
  has(error_of([&] {
        dst::blas::small_gemm_strided_batched({}, Trans::no, Trans::no, 2, 2, 2, nullptr, 2, 4,
                                              b.data(), 2, 4, false, c.data(), 2, 4, 1);
      }),
      {"blas::small_gemm_strided_batched", "A is a null pointer"});
}

}  // namespace
