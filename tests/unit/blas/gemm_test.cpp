// blas layer: gemm, strided-batched gemm and the dense layers against a naive
// double-precision reference, plus argument checking.
#include <gtest/gtest.h>
#include "fp_trap.hpp"

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "blas/gemm.hpp"
#include "blas/own_gemm.hpp"
#include "core/error.hpp"
#include "error_of.hpp"

namespace {

using dst::blas::Trans;
using dst::tensor::Backend;
using dst::tensor::Device;
using dst::tensor::ExecContext;
using dst::tensor::Shape;
using dst::tensor::Tensor;

const ExecContext kHost{};

// Marks padding between rows (ld > row length): gemm must never write it.
constexpr float kPad = 12345.0F;

using FpTrapDisabled = dst::test::FpTrapDisabled;

// A stored row-major matrix: rows x cols with row stride ld, padding filled with kPad.
struct Stored {
  std::int64_t rows, cols, ld;
  std::vector<float> v;
  Stored(std::int64_t r, std::int64_t c, std::int64_t ld_, std::mt19937& gen)
      : rows(r), cols(c), ld(ld_), v(static_cast<std::size_t>(r > 0 ? (r - 1) * ld_ + c : 0)) {
    std::uniform_real_distribution<float> dist(-1.0F, 1.0F);
    for (std::int64_t i = 0; i < r; ++i)
      for (std::int64_t j = 0; j < ld_ && i * ld_ + j < static_cast<std::int64_t>(v.size()); ++j)
        at(i, j) = j < c ? dist(gen) : kPad;
  }
  float& at(std::int64_t i, std::int64_t j) { return v[static_cast<std::size_t>(i * ld + j)]; }
  float at(std::int64_t i, std::int64_t j) const { return v[static_cast<std::size_t>(i * ld + j)]; }
  float* data() { return v.empty() ? nullptr : v.data(); }
};

// op(X)(i, l) of a stored matrix.
float op_at(const Stored& x, Trans t, std::int64_t i, std::int64_t l) {
  return t == Trans::no ? x.at(i, l) : x.at(l, i);
}

// Checks c against alpha op(A) op(B) + beta c0, computed in double.
//
// Tolerance: any summation order of a length-k fp32 dot product (OpenBLAS blocks and uses
// FMA) is within gamma_k = k u / (1 - k u) of sum |a_il b_lj| (Higham, "Accuracy and
// Stability of Numerical Algorithms", 3.1), u = 2^-24; the alpha and beta products and the
// final add cost three more roundings. We allow (k + 3) * 2u times the magnitude sum: a
// factor 2 of slack over the bound, far below the O(1) errors a wrong index or transpose
// gives. Padding between rows must be untouched (exact: pure data movement).
void expect_gemm_matches(const Stored& a, Trans ta, const Stored& b, Trans tb, const Stored& c0,
                         const Stored& c, float alpha, float beta, std::int64_t k,
                         const std::string& what) {
  const double u2 = 2.0 * std::ldexp(1.0, -24);
  int bad = 0;
  for (std::int64_t i = 0; i < c.rows; ++i) {
    for (std::int64_t j = 0; j < c.ld && i * c.ld + j < static_cast<std::int64_t>(c.v.size());
         ++j) {
      if (j >= c.cols) {
        EXPECT_EQ(c.at(i, j), kPad) << what << ": padding written at (" << i << ", " << j << ")";
        continue;
      }
      double ref = 0.0;
      double mag = 0.0;
      for (std::int64_t l = 0; l < k; ++l) {
        const double p = static_cast<double>(op_at(a, ta, i, l)) * op_at(b, tb, l, j);
        ref += p;
        mag += std::fabs(p);
      }
      ref = alpha * ref + static_cast<double>(beta) * c0.at(i, j);
      mag = std::fabs(alpha) * mag + std::fabs(static_cast<double>(beta) * c0.at(i, j));
      const double tol = static_cast<double>(k + 3) * u2 * mag;
      const double err = std::fabs(static_cast<double>(c.at(i, j)) - ref);
      if (err > tol && bad++ < 5)
        ADD_FAILURE() << what << ": C(" << i << ", " << j << ") = " << c.at(i, j) << ", reference "
                      << ref << ", |error| " << err << " > tolerance " << tol;
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

struct GemmCase {
  std::int64_t m, n, k, pad;
  float alpha, beta;
};

void run_gemm_case(Trans ta, Trans tb, const GemmCase& g, std::uint32_t seed) {
  std::mt19937 gen(seed);
  const std::int64_t ar = ta == Trans::no ? g.m : g.k, ac = ta == Trans::no ? g.k : g.m;
  const std::int64_t br = tb == Trans::no ? g.k : g.n, bc = tb == Trans::no ? g.n : g.k;
  Stored a(ar, ac, ac + g.pad, gen);
  Stored b(br, bc, bc + g.pad, gen);
  Stored c(g.m, g.n, g.n + g.pad, gen);
  const Stored c0 = c;
  dst::blas::gemm(kHost, ta, tb, g.m, g.n, g.k, g.alpha, a.data(), a.ld, b.data(), b.ld, g.beta,
                  c.data(), c.ld);
  const std::string what = std::string("ta=") + (ta == Trans::no ? "N" : "T") +
                           " tb=" + (tb == Trans::no ? "N" : "T") + " m=" + std::to_string(g.m) +
                           " n=" + std::to_string(g.n) + " k=" + std::to_string(g.k) +
                           " pad=" + std::to_string(g.pad);
  expect_gemm_matches(a, ta, b, tb, c0, c, g.alpha, g.beta, g.k, what);
}

TEST(Gemm, AllTransposesNonSquareMatchReference) {
  const Trans ts[] = {Trans::no, Trans::yes};
  for (const Trans ta : ts)
    for (const Trans tb : ts) {
      run_gemm_case(ta, tb, {7, 5, 13, 0, 1.0F, 0.0F}, 1);
      // Large enough for OpenBLAS's blocked kernels and edge tiles.
      run_gemm_case(ta, tb, {67, 45, 129, 0, 1.0F, 0.0F}, 2);
    }
}

TEST(Gemm, LeadingDimensionsLargerThanRowsAreRespected) {
  const Trans ts[] = {Trans::no, Trans::yes};
  for (const Trans ta : ts)
    for (const Trans tb : ts)
      run_gemm_case(ta, tb, {9, 11, 6, 3, 1.0F, 0.0F}, 3);
}

TEST(Gemm, AlphaAndBetaScale) {
  run_gemm_case(Trans::no, Trans::no, {8, 6, 10, 1, 1.5F, -0.5F}, 4);
  run_gemm_case(Trans::yes, Trans::yes, {8, 6, 10, 2, -2.0F, 1.0F}, 5);
  run_gemm_case(Trans::no, Trans::yes, {8, 6, 10, 0, 0.0F, 2.0F}, 6);
}

TEST(Gemm, KZeroScalesCByBeta) {
  std::mt19937 gen(7);
  Stored c(4, 3, 5, gen);
  const Stored c0 = c;
  // k == 0: A and B have no elements, so null pointers are valid.
  dst::blas::gemm(kHost, Trans::no, Trans::no, 4, 3, 0, 1.0F, nullptr, 0, nullptr, 3, 0.5F,
                  c.data(), c.ld);
  for (std::int64_t i = 0; i < 4; ++i)
    for (std::int64_t j = 0; j < (i < 3 ? 5 : 3); ++j)  // the last row is stored unpadded
      EXPECT_EQ(c.at(i, j), j < 3 ? 0.5F * c0.at(i, j) : kPad) << i << ", " << j;  // exact
}

TEST(Gemm, BetaZeroIgnoresNanInC) {
  // beta == 0 means C is write-only (BLAS convention): linear_forward relies on it to write
  // into uninitialised arena memory.
  const FpTrapDisabled no_trap;
  std::mt19937 gen(8);
  Stored a(3, 4, 4, gen), b(4, 2, 2, gen);
  std::vector<float> c(6, std::numeric_limits<float>::quiet_NaN());
  dst::blas::gemm(kHost, Trans::no, Trans::no, 3, 2, 4, 1.0F, a.data(), 4, b.data(), 2, 0.0F,
                  c.data(), 2);
  for (const float v : c)
    EXPECT_FALSE(std::isnan(v));
}

TEST(Gemm, EmptyProductsTouchNothing) {
  EXPECT_NO_THROW(dst::blas::gemm(kHost, Trans::no, Trans::no, 0, 5, 3, 1.0F, nullptr, 3, nullptr,
                                  5, 0.0F, nullptr, 5));
  EXPECT_NO_THROW(dst::blas::gemm(kHost, Trans::no, Trans::no, 5, 0, 3, 1.0F, nullptr, 3, nullptr,
                                  0, 0.0F, nullptr, 0));
}

TEST(GemmStridedBatched, EachMatrixMatchesReference) {
  const std::int64_t m = 5, n = 7, k = 9, batch = 3;
  const Trans ts[] = {Trans::no, Trans::yes};
  std::uint32_t seed = 20;
  for (const Trans ta : ts)
    for (const Trans tb : ts) {
      std::mt19937 gen(seed++);
      const std::int64_t ar = ta == Trans::no ? m : k, ac = ta == Trans::no ? k : m;
      const std::int64_t br = tb == Trans::no ? k : n, bc = tb == Trans::no ? n : k;
      std::vector<Stored> as, bs, cs;
      for (std::int64_t i = 0; i < batch; ++i) {
        as.emplace_back(ar, ac, ac + 1, gen);
        bs.emplace_back(br, bc, bc, gen);
        cs.emplace_back(m, n, n + 2, gen);
      }
      // Pack with gaps between matrices (stride > span) to catch stride mix-ups.
      const std::int64_t sa = static_cast<std::int64_t>(as[0].v.size()) + 4;
      const std::int64_t sb = static_cast<std::int64_t>(bs[0].v.size()) + 1;
      const std::int64_t sc = static_cast<std::int64_t>(cs[0].v.size()) + 3;
      std::vector<float> pa(static_cast<std::size_t>(sa * batch), kPad);
      std::vector<float> pb(static_cast<std::size_t>(sb * batch), kPad);
      std::vector<float> pc(static_cast<std::size_t>(sc * batch), kPad);
      for (std::int64_t i = 0; i < batch; ++i) {
        std::copy(as[i].v.begin(), as[i].v.end(), pa.begin() + i * sa);
        std::copy(bs[i].v.begin(), bs[i].v.end(), pb.begin() + i * sb);
        std::copy(cs[i].v.begin(), cs[i].v.end(), pc.begin() + i * sc);
      }
      dst::blas::gemm_strided_batched(kHost, ta, tb, m, n, k, 0.75F, pa.data(), as[0].ld, sa,
                                      pb.data(), bs[0].ld, sb, 0.25F, pc.data(), cs[0].ld, sc,
                                      batch);
      for (std::int64_t i = 0; i < batch; ++i) {
        Stored out = cs[i];
        std::copy(pc.begin() + i * sc,
                  pc.begin() + i * sc + static_cast<std::int64_t>(out.v.size()), out.v.begin());
        expect_gemm_matches(as[i], ta, bs[i], tb, cs[i], out, 0.75F, 0.25F, k,
                            "batch " + std::to_string(i));
        // The gap after each C matrix is not part of it.
        for (std::int64_t g = static_cast<std::int64_t>(out.v.size()); g < sc; ++g)
          EXPECT_EQ(pc[static_cast<std::size_t>(i * sc + g)], kPad);
      }
    }
}

TEST(GemmStridedBatched, SharedOperandWithStrideZero) {
  std::mt19937 gen(30);
  const std::int64_t m = 4, n = 3, k = 5, batch = 2;
  Stored a0(m, k, k, gen), a1(m, k, k, gen), b(k, n, n, gen);
  std::vector<float> pa(a0.v);
  pa.insert(pa.end(), a1.v.begin(), a1.v.end());
  std::vector<float> pc(static_cast<std::size_t>(m * n * batch), 0.0F);
  dst::blas::gemm_strided_batched(kHost, Trans::no, Trans::no, m, n, k, 1.0F, pa.data(), k, m * k,
                                  b.data(), n, 0, 0.0F, pc.data(), n, m * n, batch);
  for (std::int64_t i = 0; i < batch; ++i) {
    Stored out(m, n, n, gen);
    std::copy(pc.begin() + i * m * n, pc.begin() + (i + 1) * m * n, out.v.begin());
    expect_gemm_matches(i == 0 ? a0 : a1, Trans::no, b, Trans::no, out, out, 1.0F, 0.0F, k,
                        "shared B, batch " + std::to_string(i));
  }
}

// ---- dense layers ----------------------------------------------------------------

Tensor host_f32(std::vector<float>& v, Shape s) {
  return Tensor{v.data(), s, dst::DType::f32, Device::host};
}

std::vector<float> random_vec(std::size_t n, std::mt19937& gen) {
  std::uniform_real_distribution<float> dist(-1.0F, 1.0F);
  std::vector<float> v(n);
  for (auto& x : v)
    x = dist(gen);
  return v;
}

// |got - ref| within (k + 3) * 2u * magnitude (see expect_gemm_matches), elementwise.
void expect_close(const std::vector<float>& got, const std::vector<double>& ref,
                  const std::vector<double>& mag, std::int64_t k, const char* what) {
  const double u2 = 2.0 * std::ldexp(1.0, -24);
  ASSERT_EQ(got.size(), ref.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    EXPECT_LE(std::fabs(got[i] - ref[i]), static_cast<double>(k + 3) * u2 * mag[i])
        << what << "[" << i << "] = " << got[i] << ", reference " << ref[i];
}

struct LinearData {
  static constexpr std::int64_t B = 2, T = 3, N = B * T, in = 5, out = 4;
  std::mt19937 gen{40};
  std::vector<float> x = random_vec(N * in, gen);    // (B, T, in)
  std::vector<float> w = random_vec(out * in, gen);  // (out, in)
  std::vector<float> dy = random_vec(N * out, gen);  // (B, T, out)
};

// y = x W^T against the double-precision reference.
void expect_forward(const LinearData& d, const std::vector<float>& y) {
  std::vector<double> ref(y.size()), mag(y.size());
  for (std::int64_t r = 0; r < LinearData::N; ++r)
    for (std::int64_t o = 0; o < LinearData::out; ++o)
      for (std::int64_t i = 0; i < LinearData::in; ++i) {
        const double p = static_cast<double>(d.x[r * 5 + i]) * d.w[o * 5 + i];
        ref[r * 4 + o] += p;
        mag[r * 4 + o] += std::fabs(p);
      }
  expect_close(y, ref, mag, LinearData::in, "y");
}

// The layers through each host path: the BLAS, and dstrain's own kernel where the CPU has
// AVX-512F (own_gemm_test checks that kernel's bits; these its place in the layers).
std::vector<ExecContext> layer_contexts() {
  ExecContext blas, own;
  blas.host_gemm = dst::tensor::HostGemm::blas;
  own.host_gemm = dst::tensor::HostGemm::own;
  if (!dst::blas::own_gemm_supported()) return {blas};
  return {blas, own};
}

std::string context_name(const ExecContext& ctx) {
  return ctx.host_gemm == dst::tensor::HostGemm::blas ? "kernels.host_gemm blas"
                                                      : "kernels.host_gemm dstrain";
}

TEST(Linear, ForwardIsXTimesWTransposed) {
  for (const ExecContext& ctx : layer_contexts()) {
    SCOPED_TRACE(context_name(ctx));
    LinearData d;
    std::vector<float> y(LinearData::N * LinearData::out, -7.0F);  // (B, T, out)
    dst::blas::linear_forward(ctx, host_f32(d.x, {2, 3, 5}), host_f32(d.w, {4, 5}),
                              host_f32(y, {2, 3, 4}));
    expect_forward(d, y);
  }
}

// dx (N, in) = dy W [+ dx0]; dW (out, in) = dW0 + dy^T x.
void run_backward(const ExecContext& ctx, bool accumulate_dx, bool with_dx, bool with_dw) {
  SCOPED_TRACE(context_name(ctx));
  LinearData d;
  std::mt19937 gen(41);
  std::vector<float> dx0 = random_vec(LinearData::N * LinearData::in, gen);
  std::vector<float> dw0 = random_vec(LinearData::out * LinearData::in, gen);
  std::vector<float> dx = dx0, dw = dw0;
  dst::blas::linear_backward(
      ctx, host_f32(d.dy, {2, 3, 4}), host_f32(d.x, {2, 3, 5}), host_f32(d.w, {4, 5}),
      with_dx ? host_f32(dx, {2, 3, 5}) : Tensor{nullptr, {2, 3, 5}},
      with_dw ? host_f32(dw, {4, 5}) : Tensor{nullptr, {4, 5}}, accumulate_dx);
  std::vector<double> rdx(dx.size()), mdx(dx.size()), rdw(dw.size()), mdw(dw.size());
  for (std::size_t i = 0; i < dx.size(); ++i) {
    rdx[i] = accumulate_dx ? dx0[i] : 0.0;
    mdx[i] = std::fabs(rdx[i]);
  }
  for (std::size_t i = 0; i < dw.size(); ++i) {
    rdw[i] = dw0[i];
    mdw[i] = std::fabs(rdw[i]);
  }
  for (std::int64_t r = 0; r < LinearData::N; ++r)
    for (std::int64_t o = 0; o < LinearData::out; ++o)
      for (std::int64_t i = 0; i < LinearData::in; ++i) {
        const double px = static_cast<double>(d.dy[r * 4 + o]) * d.w[o * 5 + i];
        rdx[r * 5 + i] += px;
        mdx[r * 5 + i] += std::fabs(px);
        const double pw = static_cast<double>(d.dy[r * 4 + o]) * d.x[r * 5 + i];
        rdw[o * 5 + i] += pw;
        mdw[o * 5 + i] += std::fabs(pw);
      }
  if (with_dx)
    expect_close(dx, rdx, mdx, LinearData::out, "dx");
  else
    EXPECT_EQ(dx, dx0) << "dx was skipped but written";
  if (with_dw)
    expect_close(dw, rdw, mdw, LinearData::N, "dw");
  else
    EXPECT_EQ(dw, dw0) << "dw was skipped but written";
}

TEST(Linear, BackwardWritesDxAndAccumulatesDw) {
  for (const ExecContext& ctx : layer_contexts())
    run_backward(ctx, false, true, true);
}
TEST(Linear, BackwardAccumulatesDxOnRequest) {
  for (const ExecContext& ctx : layer_contexts())
    run_backward(ctx, true, true, true);
}
TEST(Linear, BackwardSkipsEmptyDx) {
  for (const ExecContext& ctx : layer_contexts())
    run_backward(ctx, false, false, true);
}
TEST(Linear, BackwardSkipsEmptyDw) {
  for (const ExecContext& ctx : layer_contexts())
    run_backward(ctx, false, true, false);
}

// ---- errors ----------------------------------------------------------------------

using dst::test::error_of;

void expect_has(const std::string& msg, std::initializer_list<const char*> parts) {
  for (const char* p : parts)
    EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' in: " << msg;
}

TEST(GemmErrors, NameTheCallAndTheBadValue) {
  std::vector<float> a(16), b(16), c(16);
  expect_has(error_of([&] {
               dst::blas::gemm(kHost, Trans::no, Trans::no, -1, 2, 2, 1.0F, a.data(), 2, b.data(),
                               2, 0.0F, c.data(), 2);
             }),
             {"blas::gemm", "m = -1"});
  expect_has(error_of([&] {
               dst::blas::gemm(kHost, Trans::no, Trans::no, 2, 2, 4, 1.0F, a.data(), 3, b.data(), 2,
                               0.0F, c.data(), 2);
             }),
             {"blas::gemm", "lda = 3", "row length 4", "A"});
  // Transposed B (N, K) = (2, 4) stored: ldb must be >= K.
  expect_has(error_of([&] {
               dst::blas::gemm(kHost, Trans::no, Trans::yes, 2, 2, 4, 1.0F, a.data(), 4, b.data(),
                               2, 0.0F, c.data(), 2);
             }),
             {"ldb = 2", "row length 4", "B"});
  expect_has(error_of([&] {
               dst::blas::gemm(kHost, Trans::no, Trans::no, 2, 3, 2, 1.0F, a.data(), 2, b.data(), 3,
                               0.0F, c.data(), 2);
             }),
             {"ldc = 2", "row length 3"});
  expect_has(error_of([&] {
               dst::blas::gemm(kHost, Trans::no, Trans::no, 2, 2, 2, 1.0F, nullptr, 2, b.data(), 2,
                               0.0F, c.data(), 2);
             }),
             {"blas::gemm", "A is a null pointer"});
  expect_has(error_of([&] {
               dst::blas::gemm_strided_batched(kHost, Trans::no, Trans::no, 2, 2, 2, 1.0F, a.data(),
                                               2, 4, b.data(), 2, 4, 0.0F, c.data(), 2, 3, 2);
             }),
             {"blas::gemm_strided_batched", "stride_c = 3", "overlap"});
  expect_has(error_of([&] {
               dst::blas::gemm_strided_batched(kHost, Trans::no, Trans::no, 2, 2, 2, 1.0F, a.data(),
                                               2, 4, b.data(), 2, 4, 0.0F, c.data(), 2, 4, -1);
             }),
             {"batch = -1"});
}

TEST(GemmErrors, CudaBackendWithoutCudaBuild) {
#if DSTRAIN_HAVE_CUDA
  GTEST_SKIP() << "CUDA build: the cuda back end exists";
#else
  std::vector<float> a(4), b(4), c(4);
  const ExecContext cuda{Backend::cuda, nullptr};
  expect_has(error_of([&] {
               dst::blas::gemm(cuda, Trans::no, Trans::no, 2, 2, 1, 1.0F, a.data(), 1, b.data(), 2,
                               0.0F, c.data(), 2);
             }),
             {"blas::gemm", "CUDA back end is not built"});
  expect_has(error_of([&] {
               dst::blas::gemm_strided_batched(cuda, Trans::no, Trans::no, 1, 1, 1, 1.0F, a.data(),
                                               1, 1, b.data(), 1, 1, 0.0F, c.data(), 1, 1, 2);
             }),
             {"CUDA back end is not built"});
#endif
}

TEST(LinearErrors, NameTheLayerAndTheTensor) {
  std::vector<float> x(30), w(20), y(24), big(64);
  const Tensor tx = host_f32(x, {2, 3, 5}), tw = host_f32(w, {4, 5}), ty = host_f32(y, {2, 3, 4});
  // Wrong out dimension of y.
  expect_has(error_of([&] {
               dst::blas::linear_forward(kHost, tx, tw, host_f32(y, {2, 4, 3}));
             }),
             {"blas::linear_forward", "y has shape (2, 4, 3)", "(2, 3, 5)"});
  // x's last dimension is not w's in.
  expect_has(error_of([&] {
               dst::blas::linear_forward(kHost, host_f32(x, {2, 5, 3}), tw, ty);
             }),
             {"blas::linear_forward", "x has shape (2, 5, 3)"});
  Tensor wbf = tw;
  wbf.dtype = dst::DType::bf16;
  expect_has(error_of([&] { dst::blas::linear_forward(kHost, tx, wbf, ty); }),
             {"blas::linear_forward", "w must be f32", "bf16"});
  Tensor xdev = tx;
  xdev.device = Device::cuda;
  expect_has(error_of([&] { dst::blas::linear_forward(kHost, xdev, tw, ty); }),
             {"x lives in CUDA device memory", "'kokkos'"});
  // Output aliasing an input.
  const Tensor x_in_big = host_f32(big, {2, 3, 5});
  const Tensor y_in_big{big.data() + 8, {2, 3, 4}, dst::DType::f32, Device::host};
  expect_has(error_of([&] { dst::blas::linear_forward(kHost, x_in_big, tw, y_in_big); }),
             {"y overlaps x"});
  expect_has(error_of([&] {
               dst::blas::linear_backward(kHost, ty, tx, tw, Tensor{}, host_f32(big, {5, 4}));
             }),
             {"blas::linear_backward", "dw has shape (5, 4)", "(4, 5)"});
  expect_has(error_of([&] {
               dst::blas::linear_backward(kHost, ty, tx, tw, host_f32(big, {6, 5}), Tensor{});
             }),
             {"blas::linear_backward", "dx has shape (6, 5)"});
  expect_has(error_of([&] {
               dst::blas::linear_backward(kHost, ty, Tensor{nullptr, {2, 3, 5}}, tw, Tensor{},
                                          host_f32(big, {4, 5}));
             }),
             {"blas::linear_backward", "x (2, 3, 5) has no data"});
}

}  // namespace
