// The cuBLASLt back end of the matrix products (lib/blas/cublaslt_gemm.cpp) against the host
// BLAS back end (OpenBLAS, ExecContext{} = kokkos), the reference: every (ta, tb), odd
// shapes (1, 7, 129, 1000), leading dimensions larger than the rows, beta 0 (on a C full of
// NaN, which must not be read) and 1, strided batches of 1 and 5 (and a B shared by the
// batch), pointers that are only 4-byte aligned, the bf16 and f16 math modes on operands
// that already hold bf16 / f16 values, K == 0 and alpha == 0, run-to-run bitwise
// reproducibility and the per-shape plan cache.
//
// Padding between rows and between the matrices of a batch must come back untouched:
// compared bitwise (pure data movement), like the "same call twice" results (a determinism
// claim). Everything else is compared with the tolerances derived at `tolerance_factor`.
//
// Needs a CUDA device: every test of the CublasLt fixture skips without one (CTest then
// reports it skipped). CublasLtArguments needs none: its calls are rejected before the
// back end touches the device. GoogleTest's own main, without the unit tests' FE_INVALID
// trap: the CUDA runtime's host code runs in this process, and the NaN-filled outputs of
// the beta == 0 cases are made on purpose.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "blas/detail/cublaslt_gemm.hpp"
#include "blas/gemm.hpp"
#include "core/bf16.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"

namespace dst::blas::test {
namespace {

using Index = std::int64_t;
using tensor::Backend;
using tensor::ExecContext;

/// Marks memory the product must not write: padding after each row and between matrices.
constexpr float kPad = 12345.0F;

// --- device buffers ------------------------------------------------------------------------

void cuda_check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw Error(std::string("blas_cuda_test: ") + what + ": " + cudaGetErrorName(status) + " (" +
                cudaGetErrorString(status) + ")");
}

/// Device floats; the extra element lets a view start one float in (4-byte aligned only).
class DeviceFloats {
 public:
  explicit DeviceFloats(std::size_t n) {
    void* p = nullptr;
    cuda_check(cudaMalloc(&p, (n + 1) * sizeof(float)), "cudaMalloc");
    p_ = static_cast<float*>(p);
  }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  ~DeviceFloats() { cudaFree(p_); }

  float* at(std::size_t offset) const { return p_ + offset; }
  /// Waits for all queued work first (the products run on the fixture's stream).
  void upload(const std::vector<float>& v, std::size_t offset) const {
    cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    if (v.empty()) return;
    cuda_check(cudaMemcpy(p_ + offset, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice),
               "upload");
  }
  std::vector<float> download(std::size_t n, std::size_t offset) const {
    std::vector<float> v(n);
    cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    if (n == 0) return v;
    cuda_check(cudaMemcpy(v.data(), p_ + offset, n * sizeof(float), cudaMemcpyDeviceToHost),
               "download");
    return v;
  }

 private:
  float* p_ = nullptr;
};

std::uint32_t bits_of(float f) {
  std::uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// --- host operands -------------------------------------------------------------------------------

/// `batch` row-major matrices of rows x cols with row stride ld, `stride` elements apart
/// (0: one matrix shared by the batch), in one buffer that starts filled with kPad.
struct Batch {
  Index rows, cols, ld, stride, batch;
  std::vector<float> v;

  Batch(Index r, Index c, Index ld_, Index stride_, Index batch_)
      : rows(r), cols(c), ld(ld_), stride(stride_), batch(batch_), v(size(), kPad) {}

  std::size_t size() const {
    const Index span = rows > 0 && cols > 0 ? (rows - 1) * ld + cols : 0;
    return static_cast<std::size_t>((batch - 1) * stride + span);
  }
  std::size_t index(Index b, Index i, Index j) const {
    return static_cast<std::size_t>(b * stride + i * ld + j);
  }
  template <class F>
  void fill(F&& value) {
    for (Index b = 0; b < (stride == 0 ? 1 : batch); ++b)
      for (Index i = 0; i < rows; ++i)
        for (Index j = 0; j < cols; ++j)
          v[index(b, i, j)] = value();
  }
  /// True where an element of some matrix lies (the rest is padding).
  std::vector<bool> elements() const {
    std::vector<bool> e(v.size(), false);
    for (Index b = 0; b < batch; ++b)
      for (Index i = 0; i < rows; ++i)
        for (Index j = 0; j < cols; ++j)
          e[index(b, i, j)] = true;
    return e;
  }
  Batch abs() const {
    Batch a = *this;
    for (float& x : a.v)
      x = std::fabs(x);
    return a;
  }
};

/// Uniform in [-1, 1], then rounded to the math mode's input precision: the operands the
/// model gives the bf16 / f16 modes already hold such values. For f16, values below its
/// smallest normal (2^-14) become 0: these tests are about precision, not about whether
/// the tensor cores keep half subnormals.
float random_input(std::mt19937& gen, DType math) {
  std::uniform_real_distribution<float> dist(-1.0F, 1.0F);
  const float x = dist(gen);
  switch (math) {
    case DType::bf16:
      return round_to_bf16(x);
    case DType::f16:
      return std::fabs(x) < 0x1p-14F ? 0.0F : round_to_f16(x);
    default:
      return x;
  }
}

// --- tolerances ------------------------------------------------------------------------------

/// Allowed |GPU - host| in units of mag = |alpha| (|op(A)| |op(B)|) + |beta| |C0|, the
/// magnitude sum of the terms of one result element.
///
/// Both sides compute exactly the same real number from the same fp32 inputs. The host
/// (OpenBLAS, any summation order, FMA or not) is within (k + 3) u mag of it, u = 2^-24
/// (Higham, "Accuracy and Stability of Numerical Algorithms", 3.1: gamma_k for the k-term
/// dot product, plus the alpha and beta products and the final add).
///   f32:  the GPU computes in true fp32 as well (CUBLAS_COMPUTE_32F): same bound, so
///         2 (k + 3) u. A TF32 product (relative error 2^-11 per input) would be 10^3 times
///         that at small k, which is what makes this a test of "never TF32".
///   bf16 / f16: the inputs convert to bf16 / f16 (or TF32) exactly, and the product of two
///         such values (at most 2 x 11 significant bits) is exact in fp32, so only the fp32
///         accumulation rounds. We do not assume the tensor cores round to nearest in it:
///         allowing a full ulp (2u, as truncation gives) per addition bounds the GPU by
///         2 (k + 3) u mag, and with the host's (k + 3) u the sum stays under
///         4 (k + 3) u mag.
/// Errors from a wrong index, transpose, stride or a TF32 / bf16 rounding of fp32 inputs
/// are O(2^-11 .. 1) relative: far above these.
double tolerance_factor(DType math, Index k) {
  const double u = std::ldexp(1.0, -24);
  const double terms = static_cast<double>(k + 3);
  return (math == DType::f32 ? 2.0 : 4.0) * terms * u;
}

// --- one product, on both back ends ----------------------------------------------------------

struct Case {
  Trans ta = Trans::no, tb = Trans::no;
  Index m = 1, n = 1, k = 1;
  float alpha = 1.0F, beta = 0.0F;
  DType math = DType::f32;
  Index pad = 3;           // ld = row length + pad
  Index batch = 1;         // > 1, or == 1 with `batched`: gemm_strided_batched
  bool batched = false;    // use gemm_strided_batched even for batch 1
  Index gap = 5;           // stride = span + gap
  bool shared_b = false;   // stride_b = 0
  std::size_t offset = 0;  // device views start this many floats in (1: 4-byte aligned)

  std::string str() const {
    std::string s = std::string("ta=") + (ta == Trans::no ? "N" : "T") +
                    " tb=" + (tb == Trans::no ? "N" : "T") + " m=" + std::to_string(m) +
                    " n=" + std::to_string(n) + " k=" + std::to_string(k) +
                    " alpha=" + std::to_string(alpha) + " beta=" + std::to_string(beta) +
                    " math=" + std::string(dtype_name(math)) + " pad=" + std::to_string(pad);
    if (batched || batch > 1)
      s += " batch=" + std::to_string(batch) + (shared_b ? " (B shared)" : "");
    if (offset != 0) s += " offset=" + std::to_string(offset);
    return s;
  }
};

Index stride_for(Index rows, Index cols, Index ld, Index gap) {
  return (rows - 1) * ld + cols + gap;
}

struct Operands {
  Batch a, b, c;
};

Operands make_operands(const Case& t, std::mt19937& gen) {
  const Index ar = t.ta == Trans::no ? t.m : t.k, ac = t.ta == Trans::no ? t.k : t.m;
  const Index br = t.tb == Trans::no ? t.k : t.n, bc = t.tb == Trans::no ? t.n : t.k;
  const Index lda = ac + t.pad, ldb = bc + t.pad, ldc = t.n + t.pad;
  Operands o{Batch(ar, ac, lda, stride_for(ar, ac, lda, t.gap), t.batch),
             Batch(br, bc, ldb, t.shared_b ? 0 : stride_for(br, bc, ldb, t.gap), t.batch),
             Batch(t.m, t.n, ldc, stride_for(t.m, t.n, ldc, t.gap), t.batch)};
  o.a.fill([&] { return random_input(gen, t.math); });
  o.b.fill([&] { return random_input(gen, t.math); });
  // beta == 0 must not read C: give it NaNs, which would show in every element.
  o.c.fill([&] {
    return t.beta == 0.0F ? std::numeric_limits<float>::quiet_NaN() : random_input(gen, t.math);
  });
  return o;
}

/// C = alpha op(A) op(B) + beta C through gemm.hpp, as `t` says (gemm or strided-batched).
void run(const ExecContext& ctx, const Case& t, float alpha, float beta, const float* a,
         const Batch& ha, const float* b, const Batch& hb, float* c, const Batch& hc) {
  if (t.batch > 1 || t.batched)
    gemm_strided_batched(ctx, t.ta, t.tb, t.m, t.n, t.k, alpha, a, ha.ld, ha.stride, b, hb.ld,
                         hb.stride, beta, c, hc.ld, hc.stride, t.batch);
  else
    gemm(ctx, t.ta, t.tb, t.m, t.n, t.k, alpha, a, ha.ld, b, hb.ld, beta, c, hc.ld);
}

/// The cuBLASLt result of `t` on `o` (o.c is not changed).
std::vector<float> device_result(const ExecContext& gpu, const Case& t, const Operands& o) {
  const DeviceFloats da(o.a.v.size()), db(o.b.v.size()), dc(o.c.v.size());
  da.upload(o.a.v, t.offset);
  db.upload(o.b.v, t.offset);
  dc.upload(o.c.v, t.offset);
  ExecContext ctx = gpu;
  ctx.math = t.math;
  run(ctx, t, t.alpha, t.beta, da.at(t.offset), o.a, db.at(t.offset), o.b, dc.at(t.offset), o.c);
  return dc.download(o.c.v.size(), t.offset);
}

/// Compares the cuBLASLt result with the host BLAS's on the same operands.
void expect_matches_host(const ExecContext& gpu, const Case& t, std::uint32_t seed) {
  std::mt19937 gen(seed);
  const Operands o = make_operands(t, gen);
  const std::vector<float> got = device_result(gpu, t, o);

  const ExecContext host{};
  Batch ref = o.c;
  run(host, t, t.alpha, t.beta, o.a.v.data(), o.a, o.b.v.data(), o.b, ref.v.data(), ref);
  const Batch abs_a = o.a.abs(), abs_b = o.b.abs();
  Batch mag = o.c.abs();
  run(host, t, std::fabs(t.alpha), std::fabs(t.beta), abs_a.v.data(), abs_a, abs_b.v.data(), abs_b,
      mag.v.data(), mag);

  const double factor = tolerance_factor(t.math, t.k);
  const std::vector<bool> element = o.c.elements();
  const std::string what = t.str();
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!element[i]) {
      if (bits_of(got[i]) != bits_of(kPad) && bad++ < 3)
        ADD_FAILURE() << what << ": padding at " << i << " written (" << got[i] << ")";
      continue;
    }
    const double err = std::fabs(static_cast<double>(got[i]) - ref.v[i]);
    const double tol = factor * mag.v[i];
    if (!(err <= tol) && bad++ < 3)
      ADD_FAILURE() << what << ": C[" << i << "] = " << got[i] << ", host " << ref.v[i]
                    << ", |error| " << err << " > tolerance " << tol << " (magnitude " << mag.v[i]
                    << ")";
  }
  EXPECT_EQ(bad, 0U) << what;
}

// --- the fixture -------------------------------------------------------------------------------

class CublasLt : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      (void)cudaGetLastError();
      GTEST_SKIP() << "no CUDA device: the cuBLASLt back end cannot run here";
    }
  }

  /// One non-default stream for the whole program.
  static ExecContext cuda() {
    static cudaStream_t stream = [] {
      cudaStream_t s = nullptr;
      cuda_check(cudaStreamCreate(&s), "cudaStreamCreate");
      return s;
    }();
    return ExecContext{Backend::cuda, stream, DType::f32};
  }
};

constexpr Trans kTrans[] = {Trans::no, Trans::yes};
constexpr Index kSizes[] = {1, 7, 129, 1000};

TEST_F(CublasLt, Fp32MatchesHostBlasForEveryTransposeAndShape) {
  std::uint32_t seed = 1;
  for (const Trans ta : kTrans)
    for (const Trans tb : kTrans)
      for (const Index m : kSizes)
        for (const Index n : kSizes)
          for (const Index k : kSizes)
            for (const float beta : {0.0F, 1.0F}) {
              Case t;
              t.ta = ta;
              t.tb = tb;
              t.m = m;
              t.n = n;
              t.k = k;
              t.alpha = 0.75F;
              t.beta = beta;
              expect_matches_host(cuda(), t, seed++);
            }
}

TEST_F(CublasLt, Fp32RowStridesEqualToRowLengthsAndOtherScalars) {
  std::uint32_t seed = 1000;
  for (const Trans ta : kTrans)
    for (const Trans tb : kTrans)
      for (const float beta : {0.0F, 1.0F, -0.5F}) {
        Case t;
        t.ta = ta;
        t.tb = tb;
        t.m = 129;
        t.n = 1000;
        t.k = 7;
        t.alpha = -1.25F;
        t.beta = beta;
        t.pad = 0;
        expect_matches_host(cuda(), t, seed++);
      }
}

TEST_F(CublasLt, Fp32StridedBatchedMatchesHostBlas) {
  std::uint32_t seed = 2000;
  for (const Trans ta : kTrans)
    for (const Trans tb : kTrans)
      for (const Index batch : {1, 5})
        for (const float beta : {0.0F, 1.0F})
          for (const bool shared_b : {false, true}) {
            Case t;
            t.ta = ta;
            t.tb = tb;
            t.m = 129;
            t.n = 7;
            t.k = 1000;
            t.beta = beta;
            t.batch = batch;
            t.batched = true;
            t.shared_b = shared_b;
            expect_matches_host(cuda(), t, seed++);
            t.m = 7;
            t.n = 129;
            t.k = 129;
            expect_matches_host(cuda(), t, seed++);
          }
}

TEST_F(CublasLt, FourByteAlignedOperandsMatchHostBlas) {
  std::uint32_t seed = 3000;
  for (const DType math : {DType::f32, DType::bf16, DType::f16})
    for (const float beta : {0.0F, 1.0F}) {
      Case t;
      t.ta = Trans::no;
      t.tb = Trans::yes;
      t.m = 129;
      t.n = 1000;
      t.k = 129;
      t.beta = beta;
      t.math = math;
      t.offset = 1;
      expect_matches_host(cuda(), t, seed++);
      t.batch = 5;
      t.m = 7;
      t.n = 129;
      t.gap = 2;
      expect_matches_host(cuda(), t, seed++);
    }
}

struct Shape {
  Index m, n, k;
};

// The model's shapes are covered by these: (rows, out, in) products with large K, attention
// blocks with K = 129-ish, and the odd sizes for edge tiles.
constexpr Shape kLowPrecisionShapes[] = {{1, 1, 1},      {7, 129, 1000},    {1000, 7, 129},
                                         {129, 1000, 7}, {1000, 1000, 129}, {129, 129, 1000}};

TEST_F(CublasLt, Bf16AndF16MathMatchHostBlasOnRoundedInputs) {
  std::uint32_t seed = 4000;
  for (const DType math : {DType::bf16, DType::f16})
    for (const Trans ta : kTrans)
      for (const Trans tb : kTrans)
        for (const Shape& s : kLowPrecisionShapes)
          for (const float beta : {0.0F, 1.0F})
            for (const Index pad : {0, 3}) {
              Case t;
              t.ta = ta;
              t.tb = tb;
              t.m = s.m;
              t.n = s.n;
              t.k = s.k;
              t.beta = beta;
              t.math = math;
              t.pad = pad;
              expect_matches_host(cuda(), t, seed++);
            }
}

TEST_F(CublasLt, Bf16AndF16StridedBatchedMatchHostBlas) {
  std::uint32_t seed = 5000;
  for (const DType math : {DType::bf16, DType::f16})
    for (const Trans ta : kTrans)
      for (const Trans tb : kTrans)
        for (const Index batch : {1, 5})
          for (const float beta : {0.0F, 1.0F}) {
            Case t;
            t.ta = ta;
            t.tb = tb;
            t.m = 129;
            t.n = 129;
            t.k = 1000;
            t.beta = beta;
            t.math = math;
            t.batch = batch;
            t.batched = true;
            t.pad = 0;
            t.gap = 0;
            expect_matches_host(cuda(), t, seed++);
          }
}

// K == 0 and alpha == 0 multiply nothing: C = beta C, A and B unread (NaN here), beta == 0
// writes zeros without reading C. Bitwise like the host: scaling by 0.5 is exact, and the
// zeros are +0 on both.
TEST_F(CublasLt, NoProductScalesCByBetaLikeTheHost) {
  std::uint32_t seed = 6000;
  // n = 70000 > the back end's 65536-column chunks of zeros.
  for (const Shape& s : {Shape{7, 129, 0}, Shape{3, 70000, 0}, Shape{129, 7, 5}})
    for (const float beta : {0.0F, 1.0F, 0.5F})
      for (const Index batch : {1, 3}) {
        Case t;
        t.m = s.m;
        t.n = s.n;
        t.k = s.k;
        t.alpha = s.k == 0 ? 1.0F : 0.0F;
        t.beta = beta;
        t.batch = batch;
        std::mt19937 gen(seed++);
        Operands o = make_operands(t, gen);
        o.a.fill([] { return std::numeric_limits<float>::quiet_NaN(); });
        o.b.fill([] { return std::numeric_limits<float>::quiet_NaN(); });
        const std::vector<float> got = device_result(cuda(), t, o);
        Batch ref = o.c;
        run(ExecContext{}, t, t.alpha, t.beta, o.a.v.data(), o.a, o.b.v.data(), o.b, ref.v.data(),
            ref);
        std::size_t differ = 0;
        for (std::size_t i = 0; i < got.size(); ++i)
          if (bits_of(got[i]) != bits_of(ref.v[i]) && differ++ < 3)
            ADD_FAILURE() << t.str() << ": C[" << i << "] = " << got[i] << ", host " << ref.v[i];
        EXPECT_EQ(differ, 0U) << t.str();
      }
}

// The same call twice gives the same bits: one algorithm per shape (the plan cache), no
// split-K reductions, our own workspace.
TEST_F(CublasLt, SameCallTwiceGivesTheSameBits) {
  std::uint32_t seed = 7000;
  for (const DType math : {DType::f32, DType::bf16, DType::f16})
    for (const float beta : {0.0F, 1.0F})
      for (const Index batch : {1, 5}) {
        Case t;
        t.m = batch == 1 ? 1000 : 129;
        t.n = batch == 1 ? 1000 : 129;
        t.k = 1000;
        t.tb = Trans::yes;
        t.beta = beta;
        t.math = math;
        t.batch = batch;
        t.pad = 0;
        std::mt19937 gen(seed++);
        const Operands o = make_operands(t, gen);
        const DeviceFloats da(o.a.v.size()), db(o.b.v.size()), dc(o.c.v.size());
        da.upload(o.a.v, 0);
        db.upload(o.b.v, 0);
        ExecContext ctx = cuda();
        ctx.math = math;
        std::vector<float> results[2];
        for (auto& r : results) {
          dc.upload(o.c.v, 0);  // beta == 1 accumulates: start from the same C each time
          run(ctx, t, t.alpha, t.beta, da.at(0), o.a, db.at(0), o.b, dc.at(0), o.c);
          r = dc.download(o.c.v.size(), 0);
        }
        std::size_t differ = 0;
        for (std::size_t i = 0; i < results[0].size(); ++i)
          if (bits_of(results[0][i]) != bits_of(results[1][i]) && differ++ < 3)
            ADD_FAILURE() << t.str() << ": C[" << i << "] = " << results[1][i] << ", first run "
                          << results[0][i];
        EXPECT_EQ(differ, 0U) << t.str() << ": " << differ << " elements differ between runs";
      }
}

// The heuristic is asked once per plan key; a later call of the shape reuses the plan.
TEST_F(CublasLt, SecondCallOfAShapeDoesNotQueryTheHeuristic) {
  // Sizes no other test uses, so the first call below is the first of its shape.
  constexpr Index m = 37, n = 41, k = 43;
  const DeviceFloats a(m * k + 4), b(k * n + 4), c(m * n + 4), a2(m * k), b2(k * n), c2(m * n);
  const ExecContext f32 = cuda();
  ExecContext bf16 = f32;
  bf16.math = DType::bf16;
  const auto queries = [] { return detail::cublaslt_heuristic_queries(); };
  const auto product = [&](const ExecContext& ctx, const float* pa, const float* pb, float* pc,
                           float beta) {
    gemm(ctx, Trans::no, Trans::no, m, n, k, 1.0F, pa, k, pb, n, beta, pc, n);
    cuda_check(cudaStreamSynchronize(static_cast<cudaStream_t>(ctx.stream)), "sync");
  };

  // (Contents do not matter here: only which plans are made.)
  product(f32, a.at(0), b.at(0), c.at(0), 0.0F);
  const std::uint64_t q0 = queries();
  const std::size_t plans0 = detail::cublaslt_cache_size();
  ASSERT_GE(q0, 1U);

  product(f32, a.at(0), b.at(0), c.at(0), 0.0F);
  EXPECT_EQ(queries(), q0) << "same shape, same buffers";
  product(f32, a2.at(0), b2.at(0), c2.at(0), 0.0F);
  EXPECT_EQ(queries(), q0) << "same shape, other buffers of the same alignment";
  gemm_strided_batched(f32, Trans::no, Trans::no, m, n, k, 1.0F, a.at(0), k, m * k, b.at(0), n,
                       k * n, 0.0F, c.at(0), n, m * n, 1);
  EXPECT_EQ(queries(), q0) << "a batch of one shares the single product's plan";
  EXPECT_EQ(detail::cublaslt_cache_size(), plans0);

  product(f32, a.at(0), b.at(0), c.at(0), 1.0F);
  EXPECT_EQ(queries(), q0 + 1) << "beta != 0 is another plan";
  product(bf16, a.at(0), b.at(0), c.at(0), 0.0F);
  EXPECT_EQ(queries(), q0 + 2) << "math bf16 is another plan";
  product(f32, a.at(1), b.at(0), c.at(0), 0.0F);
  EXPECT_EQ(queries(), q0 + 3) << "A only 4-byte aligned is another plan";
  EXPECT_EQ(detail::cublaslt_cache_size(), plans0 + 3);

  product(f32, a.at(0), b.at(0), c.at(0), 1.0F);
  product(bf16, a2.at(0), b2.at(0), c2.at(0), 0.0F);
  product(f32, a.at(1), b2.at(0), c2.at(0), 0.0F);
  EXPECT_EQ(queries(), q0 + 3) << "every plan above is cached";
}

// Needs no device: an unknown math mode is rejected before the back end touches it.
TEST(CublasLtArguments, UnsupportedMathModeIsNamed) {
  std::vector<float> a(4, 1.0F), b(4, 1.0F), c(4, 0.0F);
  const ExecContext ctx{Backend::cuda, nullptr, DType::f64};
  for (const bool batched : {false, true}) {
    std::string message;
    try {
      if (batched)
        gemm_strided_batched(ctx, Trans::no, Trans::no, 2, 2, 2, 1.0F, a.data(), 2, 4, b.data(), 2,
                             4, 0.0F, c.data(), 2, 4, 1);
      else
        gemm(ctx, Trans::no, Trans::no, 2, 2, 2, 1.0F, a.data(), 2, b.data(), 2, 0.0F, c.data(), 2);
    } catch (const Error& e) {
      message = e.what();
    }
    EXPECT_NE(message.find(batched ? "blas::gemm_strided_batched" : "blas::gemm"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("math mode 'f64'"), std::string::npos) << message;
    EXPECT_NE(message.find("f32, bf16, f16"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace dst::blas::test
