// dstrain's own host kernels (blas/own_gemm.hpp), small_gemm (attention) and blocked_gemm
// (the dense layers): the exact bits of a scalar chain of fused multiply-adds in ascending
// k, for every transpose, tile edge, block edge and stride; padding between rows
// untouched; what they compute when accumulating; and that the layers and attention reach
// them as kernels.host_gemm says.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "blas/gemm.hpp"
#include "blas/host_blas.hpp"
#include "blas/own_gemm.hpp"
#include "error_of.hpp"

namespace {

using dst::blas::Trans;

// small_gemm or blocked_gemm: the same contract.
using Kernel = void (*)(Trans, Trans, std::int64_t, std::int64_t, std::int64_t, const float*,
                        std::int64_t, const float*, std::int64_t, bool, float*, std::int64_t);

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

class OwnGemm : public ::testing::Test {
 protected:
  void SetUp() override {
    // A CPU without AVX-512F runs every product in OpenBLAS (gemm_test covers it).
    if (!dst::blas::own_gemm_supported())
      GTEST_SKIP() << "this CPU has no AVX-512F: every product uses OpenBLAS";
  }
};
using SmallGemm = OwnGemm;
using BlockedGemm = OwnGemm;

void check_case(Kernel kernel, const Case& cs, std::mt19937& gen) {
  SCOPED_TRACE(name_of(cs));
  const Stored a(cs.ta == Trans::no ? cs.m : cs.k, cs.ta == Trans::no ? cs.k : cs.m, gen);
  const Stored b(cs.tb == Trans::no ? cs.k : cs.n, cs.tb == Trans::no ? cs.n : cs.k, gen);
  Stored c(cs.m, cs.n, gen);
  const Stored c0 = c;
  kernel(cs.ta, cs.tb, cs.m, cs.n, cs.k, a.v.data(), a.ld, b.v.data(), b.ld, cs.accumulate,
         c.v.data(), c.ld);
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
              check_case(dst::blas::small_gemm, {ta, tb, m, n, k, accumulate}, gen);
  for (std::int64_t r1 : {64, 128, 192, 256}) {  // tiny's attention products at T = 256
    check_case(dst::blas::small_gemm, {Trans::no, Trans::yes, 64, r1, 64, false}, gen);  // scores
    check_case(dst::blas::small_gemm, {Trans::no, Trans::no, 64, 64, r1, false}, gen);   // P V
    check_case(dst::blas::small_gemm, {Trans::yes, Trans::no, r1, 64, 64, true}, gen);   // d_v
  }
}

void expect_empty_products_touch_nothing(Kernel kernel) {
  std::vector<float> a(16, 1.0F), b(16, 1.0F), c(16, 3.0F);
  kernel(Trans::no, Trans::no, 0, 4, 4, a.data(), 4, b.data(), 4, false, c.data(), 4);
  kernel(Trans::no, Trans::no, 4, 0, 4, a.data(), 4, b.data(), 4, false, c.data(), 4);
  for (float x : c)
    EXPECT_EQ(x, 3.0F);
  kernel(Trans::no, Trans::no, 4, 4, 0, a.data(), 4, b.data(), 4, true, c.data(), 4);
  for (float x : c)
    EXPECT_EQ(x, 3.0F);
  kernel(Trans::no, Trans::no, 4, 4, 0, a.data(), 4, b.data(), 4, false, c.data(), 4);
  for (float x : c)
    EXPECT_EQ(x, 0.0F);
}

TEST_F(SmallGemm, EmptyProductsTouchNothingAndKZeroWritesZeros) {
  expect_empty_products_touch_nothing(dst::blas::small_gemm);
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

TEST_F(BlockedGemm, EqualsTheScalarFmaChainBitForBit) {
  std::mt19937 gen(13);
  // Rows around the 12-row tile, columns around the 16-float vector and the 32-column
  // panel, depths within one k block and across two.
  const std::int64_t rows[] = {1, 11, 12, 13, 37};
  const std::int64_t cols[] = {1, 16, 17, 33};
  const std::int64_t depths[] = {1, 3, 600};
  for (Trans ta : {Trans::no, Trans::yes})
    for (Trans tb : {Trans::no, Trans::yes})
      for (bool accumulate : {false, true}) {
        for (std::int64_t m : rows)
          for (std::int64_t n : cols)
            for (std::int64_t k : depths)
              check_case(dst::blas::blocked_gemm, {ta, tb, m, n, k, accumulate}, gen);
        // The block edges: columns in two blocks (512 at most each), k in five (256), each
        // with a panel, a vector or a tile cut short at its end.
        check_case(dst::blas::blocked_gemm, {ta, tb, 26, 545, 20, accumulate}, gen);
        check_case(dst::blas::blocked_gemm, {ta, tb, 25, 40, 1025, accumulate}, gen);
      }
}

TEST_F(BlockedGemm, EmptyProductsTouchNothingAndKZeroWritesZeros) {
  expect_empty_products_touch_nothing(dst::blas::blocked_gemm);
}

// What kernels.host_gemm decides (ExecContext::host_gemm): the dense layers' products (the
// forward and the weight gradient) and attention's give exactly the bits of dstrain's
// kernels, or of the BLAS. The two differ here (the BLAS sums k in blocks into C), so a
// switch that did nothing would fail.
TEST_F(OwnGemm, LayersAndAttentionRunWhereHostGemmSays) {
  using dst::tensor::ExecContext;
  using dst::tensor::HostGemm;
  using dst::tensor::Tensor;
  std::mt19937 gen(17);
  const std::int64_t rows = 40, in = 1000, out = 24;
  const Stored x(rows, in, gen), w(out, in, gen);
  std::vector<float> xs(static_cast<std::size_t>(rows * in)),
      ws(static_cast<std::size_t>(out * in));
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t p = 0; p < in; ++p)
      xs[static_cast<std::size_t>(i * in + p)] = x.at(i, p);
  for (std::int64_t o = 0; o < out; ++o)
    for (std::int64_t p = 0; p < in; ++p)
      ws[static_cast<std::size_t>(o * in + p)] = w.at(o, p);
  auto forward = [&](HostGemm who) {
    ExecContext ctx;
    ctx.host_gemm = who;
    std::vector<float> y(static_cast<std::size_t>(rows * out));
    dst::blas::linear_forward(ctx, Tensor{xs.data(), {rows, in}, dst::DType::f32},
                              Tensor{ws.data(), {out, in}, dst::DType::f32},
                              Tensor{y.data(), {rows, out}, dst::DType::f32});
    return y;
  };
  auto attention = [&](HostGemm who) {  // the scores' product: x (rows, in) x w^T
    ExecContext ctx;
    ctx.host_gemm = who;
    std::vector<float> y(static_cast<std::size_t>(rows * out));
    dst::blas::small_gemm_strided_batched(ctx, Trans::no, Trans::yes, rows, out, in, xs.data(), in,
                                          0, ws.data(), in, 0, false, y.data(), out, 0, 1);
    return y;
  };
  // dW (out, in) += dy^T x: the weight gradient, dy (rows, out) and x (rows, in) as above
  // with rows as k; dW starts from w.
  auto weight_gradient = [&](HostGemm who) {
    ExecContext ctx;
    ctx.host_gemm = who;
    std::vector<float> dy(static_cast<std::size_t>(in * out)), dw = ws;  // dy: (in, out)
    for (std::size_t i = 0; i < dy.size(); ++i)
      dy[i] = xs[i % xs.size()] * 0.5F;
    std::vector<float> x2(static_cast<std::size_t>(in * in));
    for (std::size_t i = 0; i < x2.size(); ++i)
      x2[i] = xs[(i * 7) % xs.size()];
    dst::blas::linear_backward(ctx, Tensor{dy.data(), {in, out}, dst::DType::f32},
                               Tensor{x2.data(), {in, in}, dst::DType::f32},
                               Tensor{ws.data(), {out, in}, dst::DType::f32}, Tensor{},
                               Tensor{dw.data(), {out, in}, dst::DType::f32});
    return dw;
  };
  std::vector<float> own(static_cast<std::size_t>(rows * out)), small(own.size()), blas(own.size());
  dst::blas::blocked_gemm(Trans::no, Trans::yes, rows, out, in, xs.data(), in, ws.data(), in, false,
                          own.data(), out);
  dst::blas::small_gemm(Trans::no, Trans::yes, rows, out, in, xs.data(), in, ws.data(), in, false,
                        small.data(), out);
  ExecContext blas_ctx;
  blas_ctx.host_gemm = HostGemm::blas;
  dst::blas::gemm(blas_ctx, Trans::no, Trans::yes, rows, out, in, 1.0F, xs.data(), in, ws.data(),
                  in, 0.0F, blas.data(), out);
  ASSERT_EQ(own, small) << "the two drivers of one kernel disagree";
  ASSERT_NE(own, blas) << "OpenBLAS gave the own kernel's bits: this test cannot tell them apart";
  EXPECT_EQ(forward(HostGemm::own), own);
  EXPECT_EQ(forward(HostGemm::blas), blas);
  EXPECT_EQ(attention(HostGemm::own), small);
  EXPECT_EQ(attention(HostGemm::automatic), small);
  EXPECT_EQ(attention(HostGemm::blas), blas);
  // automatic: the forward (and dx) products in dstrain's kernel while the BLAS computes on
  // one thread; the weight gradients always in the BLAS.
  const bool one_thread = dst::blas::host_blas_threads() <= 1;
  EXPECT_EQ(forward(HostGemm::automatic), one_thread ? own : blas);
  const std::vector<float> dw_own = weight_gradient(HostGemm::own);
  const std::vector<float> dw_blas = weight_gradient(HostGemm::blas);
  ASSERT_NE(dw_own, dw_blas) << "the weight gradient's two paths gave the same bits";
  EXPECT_EQ(weight_gradient(HostGemm::automatic), dw_blas);
  ExecContext automatic;
  const std::string blas_name =
      one_thread ? "the host BLAS"
                 : "the host BLAS (" + std::to_string(dst::blas::host_blas_threads()) + " threads)";
  EXPECT_EQ(dst::blas::describe_host_products(automatic),
            "dense layers: " +
                (one_thread ? "dstrain's AVX-512 kernel (forward, input gradients), " + blas_name +
                                  " (weight gradients)"
                            : blas_name) +
                "; attention: dstrain's AVX-512 kernel");
  ExecContext all_own;
  all_own.host_gemm = HostGemm::own;
  EXPECT_EQ(dst::blas::describe_host_products(all_own),
            "dense layers: dstrain's AVX-512 kernel; attention: dstrain's AVX-512 kernel");
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
