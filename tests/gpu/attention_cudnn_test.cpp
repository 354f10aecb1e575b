// Fused attention (cuDNN SDPA, lib/kernels/cuda/attention_cudnn.cpp) against the unfused
// pieces on the host: host BLAS (blas::gemm) for the four products and the Kokkos causal
// softmax (kernels::causal_softmax_forward/backward) in between, in f32, from the same
// inputs rounded to ctx.math; the log-sum-exp stats in double. Multi-head (KV = H) and
// grouped-query (KV = H / 4) attention, T in {1, 64, 257} (one row, a tile, a ragged last
// tile), D in {64, 128}, bf16, and one f16 shape.
//
// Tolerances. The reference computes in f32 from the 16-bit inputs; the fused path rounds
// the probabilities P (and dS) to the 16-bit type before the second products and rounds every
// output (out, dq, dk, dv) to it. With u the unit roundoff (2^-8 for bf16, 2^-11 for f16),
// each rounding moves a result by at most u times the sum of the magnitudes of its terms,
// which for these inputs is within a few times the largest magnitude of that output; the
// softmax backward's cancellation (dP - rowsum(dO * O)) adds no more than that, because both
// terms come from the same 16-bit dO, O and V. So every element must be within
// 2^-5 = 8u(bf16) of the largest reference magnitude of its tensor, plus 1e-4 absolute: the
// f32 rounding of terms that cancel exactly in exact arithmetic (dq and dk are 0 at T = 1),
// far below the 0.1..10 magnitudes of the tensors otherwise. The stats are computed in f32
// from the same 16-bit q and k on both sides: 1e-3 absolute + 1e-4 relative (a wrong mask or
// scale moves them by more than 0.01).
//
// Needs a CUDA device (every test skips without one). With a device of compute capability
// 8.0 or newer in a build with cuDNN, every tested shape must be supported: a refusal fails
// the test with cuDNN's reason. GoogleTest's own main, without the unit tests' FE_INVALID
// trap (the CUDA runtime's host code runs in this process).
#include <cuda_runtime_api.h>
#if DSTRAIN_HAVE_CUDNN
#include <cudnn.h>  // cudnnGetVersion: which sequence lengths the release runs fused
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "blas/gemm.hpp"
#include "core/bf16.hpp"
#include "error_of.hpp"
#include "kernels_test_util.hpp"

#ifndef DSTRAIN_HAVE_CUDNN
#define DSTRAIN_HAVE_CUDNN 0
#endif

namespace dst::kernels::test {
namespace {

using Index = std::int64_t;

void cuda_check(const cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw Error(std::string("attention_cudnn_test: ") + what + ": " + cudaGetErrorName(status) +
                " (" + cudaGetErrorString(status) + ")");
}

/// Device copy of a host vector of floats.
class DeviceFloats {
 public:
  explicit DeviceFloats(const std::vector<float>& v) : n_(v.size()) {
    void* p = nullptr;
    cuda_check(cudaMalloc(&p, std::max<std::size_t>(n_, 1) * sizeof(float)), "cudaMalloc");
    p_ = static_cast<float*>(p);
    cuda_check(cudaMemcpy(p_, v.data(), n_ * sizeof(float), cudaMemcpyHostToDevice), "upload");
  }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  ~DeviceFloats() { cudaFree(p_); }

  /// Waits for all queued work first.
  std::vector<float> download() const {
    std::vector<float> v(n_);
    cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    cuda_check(cudaMemcpy(v.data(), p_, n_ * sizeof(float), cudaMemcpyDeviceToHost), "download");
    return v;
  }
  Tensor view(Shape s) const { return Tensor{p_, s, DType::f32, Device::cuda}; }

 private:
  std::size_t n_;
  float* p_ = nullptr;
};

/// Compute capability major of the current device, or 0 without a device.
int device_major() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return 0;
  }
  int major = 0;
  cuda_check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0),
             "cudaDeviceGetAttribute");
  return major;
}

/// One non-default stream for the whole program (the back end keeps scratch per stream).
ExecContext cuda_ctx(const DType math) {
  static cudaStream_t stream = [] {
    cudaStream_t s = nullptr;
    cuda_check(cudaStreamCreate(&s), "cudaStreamCreate");
    return s;
  }();
  return ExecContext{tensor::Backend::cuda, stream, math};
}

struct Case {
  Index b, t, h, kv, d;
  DType math;
};

std::string case_name(const Case& c) {
  return "B=" + std::to_string(c.b) + " T=" + std::to_string(c.t) + " H=" + std::to_string(c.h) +
         " KV=" + std::to_string(c.kv) + " D=" + std::to_string(c.d) + " " +
         std::string(dtype_name(c.math));
}

std::vector<float> rounded(std::vector<float> v, const DType math) {
  for (auto& x : v)
    x = math == DType::f16 ? round_to_f16(x) : round_to_bf16(x);
  return v;
}

struct Inputs {
  std::vector<float> q, k, v, dout;  // (B,T,H,D), (B,T,KV,D), (B,T,KV,D), (B,T,H,D)
};

Inputs make_inputs(const Case& c, std::uint32_t seed) {
  const auto nq = static_cast<std::size_t>(c.b * c.t * c.h * c.d);
  const auto nkv = static_cast<std::size_t>(c.b * c.t * c.kv * c.d);
  // q and k in [-2, 2): with scale 1/sqrt(D) the scores have a spread of about 1.3, so the
  // softmax rows are neither flat nor one-hot.
  return Inputs{rounded(random_vec(nq, seed, -2.0f, 2.0f), c.math),
                rounded(random_vec(nkv, seed + 1, -2.0f, 2.0f), c.math),
                rounded(random_vec(nkv, seed + 2), c.math),
                rounded(random_vec(nq, seed + 3), c.math)};
}

struct Reference {
  std::vector<float> out, dq, dk, dv;
  std::vector<double> stats;  // (B, H, T)
};

/// The unfused path on the host: per (b, h), S = Q K^T (gemm), P = causal softmax(scale S),
/// O = P V; dP = dO V^T, dS = softmax backward, dQ = dS K, dK += dS^T Q, dV += P^T dO (the
/// += sum a group's query heads onto their shared key/value head).
Reference reference(const Case& c, const Inputs& in, const float scale) {
  const ExecContext host = kokkos_ctx();
  const Index T = c.t, H = c.h, KV = c.kv, D = c.d, group = c.h / c.kv;
  const Index ldq = H * D, ldkv = KV * D;
  const auto n_scores = static_cast<std::size_t>(c.b * H * T * T);
  std::vector<float> scores(n_scores), probs(n_scores), dprobs(n_scores), dscores(n_scores);
  Reference r;
  r.out.assign(in.q.size(), 0.0f);
  r.dq.assign(in.q.size(), 0.0f);
  r.dk.assign(in.k.size(), 0.0f);
  r.dv.assign(in.v.size(), 0.0f);
  r.stats.assign(static_cast<std::size_t>(c.b * H * T), 0.0);
  using blas::Trans;
  for (Index b = 0; b < c.b; ++b)
    for (Index h = 0; h < H; ++h) {
      const Index qo = b * T * ldq + h * D, ko = b * T * ldkv + (h / group) * D;
      float* s = scores.data() + (b * H + h) * T * T;
      blas::gemm(host, Trans::no, Trans::yes, T, T, D, 1.0f, in.q.data() + qo, ldq,
                 in.k.data() + ko, ldkv, 0.0f, s, T);
      for (Index i = 0; i < T; ++i) {  // log-sum-exp of the scaled live scores, in double
        double m = -std::numeric_limits<double>::infinity();
        for (Index j = 0; j <= i; ++j)
          m = std::max(m, static_cast<double>(scale) * s[i * T + j]);
        double sum = 0.0;
        for (Index j = 0; j <= i; ++j)
          sum += std::exp(static_cast<double>(scale) * s[i * T + j] - m);
        r.stats[static_cast<std::size_t>((b * H + h) * T + i)] = m + std::log(sum);
      }
    }
  const Shape sshape{c.b, H, T, T};
  causal_softmax_forward(host, view(scores, sshape), scale, view(probs, sshape));
  for (Index b = 0; b < c.b; ++b)
    for (Index h = 0; h < H; ++h) {
      const Index qo = b * T * ldq + h * D, ko = b * T * ldkv + (h / group) * D;
      const float* p = probs.data() + (b * H + h) * T * T;
      blas::gemm(host, Trans::no, Trans::no, T, D, T, 1.0f, p, T, in.v.data() + ko, ldkv, 0.0f,
                 r.out.data() + qo, ldq);
      blas::gemm(host, Trans::no, Trans::yes, T, T, D, 1.0f, in.dout.data() + qo, ldq,
                 in.v.data() + ko, ldkv, 0.0f, dprobs.data() + (b * H + h) * T * T, T);
    }
  causal_softmax_backward(host, view(probs, sshape), view(dprobs, sshape), scale,
                          view(dscores, sshape));
  for (Index b = 0; b < c.b; ++b)
    for (Index h = 0; h < H; ++h) {
      const Index qo = b * T * ldq + h * D, ko = b * T * ldkv + (h / group) * D;
      const float* p = probs.data() + (b * H + h) * T * T;
      const float* ds = dscores.data() + (b * H + h) * T * T;
      blas::gemm(host, Trans::no, Trans::no, T, D, T, 1.0f, ds, T, in.k.data() + ko, ldkv, 0.0f,
                 r.dq.data() + qo, ldq);
      blas::gemm(host, Trans::yes, Trans::no, T, D, T, 1.0f, ds, T, in.q.data() + qo, ldq, 1.0f,
                 r.dk.data() + ko, ldkv);
      blas::gemm(host, Trans::yes, Trans::no, T, D, T, 1.0f, p, T, in.dout.data() + qo, ldq, 1.0f,
                 r.dv.data() + ko, ldkv);
    }
  return r;
}

/// Every element within 2^-5 of the tensor's largest reference magnitude, plus 1e-4 (see the
/// file comment); reports the first offenders and the largest error.
void expect_close_to_scale(const std::vector<float>& actual, const std::vector<float>& expected,
                           const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  double scale = 0.0;
  for (const float e : expected)
    scale = std::max(scale, std::fabs(static_cast<double>(e)));
  const double tol = 0x1p-5 * scale + 1e-4;
  double worst = 0.0;
  int reported = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double err = std::fabs(static_cast<double>(actual[i]) - expected[i]);
    worst = std::max(worst, std::isnan(err) ? std::numeric_limits<double>::infinity() : err);
    if (!(err <= tol) && reported++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: got " << actual[i] << ", expected " << expected[i]
                    << " (error " << err << " > " << tol << ")";
  }
  EXPECT_LE(worst, tol) << what << ": largest error " << worst << " (max |expected| " << scale
                        << ")";
}

using dst::test::error_of;

class FusedAttention : public ::testing::Test {
 protected:
  void SetUp() override {
    major_ = device_major();
    if (major_ == 0) GTEST_SKIP() << "no CUDA device: the CUDA back end cannot run here";
  }
  /// Whether the accuracy tests can run here (cuDNN in the build, sm_80 or newer).
  bool fused_expected() const { return DSTRAIN_HAVE_CUDNN && major_ >= 8; }

  void run_case(const Case& c, std::uint32_t seed);

  int major_ = 0;
};

void FusedAttention::run_case(const Case& c, const std::uint32_t seed) {
  const std::string what = case_name(c);
  const ExecContext ctx = cuda_ctx(c.math);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  const Shape qs{c.b, c.t, c.h, c.d}, ks{c.b, c.t, c.kv, c.d}, ss{c.b, c.h, c.t};
  if (!fused_attention_supported(ctx, c.b, c.t, c.h, c.kv, c.d)) {
    // The forward's error carries cuDNN's reason.
    const DeviceFloats zq(std::vector<float>(static_cast<std::size_t>(qs.numel())));
    const DeviceFloats zk(std::vector<float>(static_cast<std::size_t>(ks.numel())));
    const DeviceFloats zs(std::vector<float>(static_cast<std::size_t>(ss.numel())));
    ADD_FAILURE() << what << ": fused_attention_supported() is false: " << error_of([&] {
      fused_attention_forward(ctx, zq.view(qs), zk.view(ks), zk.view(ks), scale, zq.view(qs),
                              zs.view(ss));
    });
    return;
  }
  const Inputs in = make_inputs(c, seed);
  const Reference ref = reference(c, in, scale);

  const DeviceFloats q(in.q), k(in.k), v(in.v), dout(in.dout);
  const DeviceFloats out(std::vector<float>(in.q.size(), -1.0f));
  const DeviceFloats stats(std::vector<float>(static_cast<std::size_t>(ss.numel()), -1.0f));
  fused_attention_forward(ctx, q.view(qs), k.view(ks), v.view(ks), scale, out.view(qs),
                          stats.view(ss));
  const std::vector<float> out_h = out.download();
  expect_close_to_scale(out_h, ref.out, what + " out");
  const std::vector<float> stats_h = stats.download();
  for (std::size_t i = 0, bad = 0; i < stats_h.size(); ++i) {
    const double err = std::fabs(stats_h[i] - ref.stats[i]);
    if (!(err <= 1e-3 + 1e-4 * std::fabs(ref.stats[i])) && bad++ < 5)
      ADD_FAILURE() << what << " stats[" << i << "]: got " << stats_h[i] << ", expected "
                    << ref.stats[i];
  }

  const DeviceFloats dq(std::vector<float>(in.q.size(), -1.0f));
  const DeviceFloats dk(std::vector<float>(in.k.size(), -1.0f));
  const DeviceFloats dv(std::vector<float>(in.v.size(), -1.0f));
  fused_attention_backward(ctx, q.view(qs), k.view(ks), v.view(ks), out.view(qs), dout.view(qs),
                           stats.view(ss), scale, dq.view(qs), dk.view(ks), dv.view(ks));
  expect_close_to_scale(dq.download(), ref.dq, what + " dq");
  expect_close_to_scale(dk.download(), ref.dk, what + " dk");
  expect_close_to_scale(dv.download(), ref.dv, what + " dv");
}

TEST_F(FusedAttention, MatchesUnfusedReferenceMhaAndGqa) {
  if (!fused_expected())
    GTEST_SKIP() << (DSTRAIN_HAVE_CUDNN ? "compute capability below 8.0: no fused attention"
                                        : "built without cuDNN: no fused attention");
  std::uint32_t seed = 1000;
  // T = 1 is refused (cuDNN's backward does not support it: RefusesUnsupportedShapes); with
  // a cuDNN release up to 9.15.0, so are 64 and 257 (not multiples of 128), and 256 remains.
#if DSTRAIN_HAVE_CUDNN
  const bool old_cudnn = cudnnGetVersion() <= 91500;
#else
  const bool old_cudnn = false;
#endif
  for (const Index t : old_cudnn ? std::vector<Index>{256} : std::vector<Index>{2, 64, 257})
    for (const Index d : {64, 128}) {
      run_case(Case{2, t, 4, 4, d, DType::bf16}, seed += 10);  // multi-head
      run_case(Case{2, t, 8, 2, d, DType::bf16}, seed += 10);  // grouped-query, 4 per group
    }
}

TEST_F(FusedAttention, MatchesUnfusedReferenceF16) {
  if (!fused_expected()) GTEST_SKIP() << "no fused attention in this build or on this device";
  // T = 128: a multiple of 128, so every cuDNN 9 release runs it fused (see above).
  run_case(Case{1, 128, 4, 2, 64, DType::f16}, 2000);
}

TEST_F(FusedAttention, SecondCallReusesThePlanAndGivesTheSameForward) {
  if (!fused_expected()) GTEST_SKIP() << "no fused attention in this build or on this device";
  // The forward has no atomics: the same inputs give the same bits, from the cached plan.
  const Case c{2, 128, 8, 2, 64, DType::bf16};  // T = 128: fused on every cuDNN 9
  const ExecContext ctx = cuda_ctx(c.math);
  const Inputs in = make_inputs(c, 3000);
  const Shape qs{c.b, c.t, c.h, c.d}, ks{c.b, c.t, c.kv, c.d}, ss{c.b, c.h, c.t};
  const DeviceFloats q(in.q), k(in.k), v(in.v);
  const DeviceFloats out(std::vector<float>(in.q.size())),
      stats(std::vector<float>(static_cast<std::size_t>(ss.numel())));
  fused_attention_forward(ctx, q.view(qs), k.view(ks), v.view(ks), 0.125f, out.view(qs),
                          stats.view(ss));
  const std::vector<float> first = out.download();
  fused_attention_forward(ctx, q.view(qs), k.view(ks), v.view(ks), 0.125f, out.view(qs),
                          stats.view(ss));
  expect_bitwise(out.download(), first, "second forward");
}

// --- the reference itself, against attention written out in double (no device needed) -----

TEST(FusedAttentionReference, MatchesAttentionWrittenOutInDouble) {
  const Case c{2, 5, 4, 2, 8, DType::bf16};  // grouped: query heads 0, 1 -> kv 0; 2, 3 -> kv 1
  const Inputs in = make_inputs(c, 42);
  const float scale = 0.35f;
  const Reference r = reference(c, in, scale);
  const Index T = c.t, H = c.h, KV = c.kv, D = c.d, g = c.h / c.kv;
  const auto at_q = [&](Index b, Index t, Index h, Index d) {
    return static_cast<std::size_t>(((b * T + t) * H + h) * D + d);
  };
  const auto at_kv = [&](Index b, Index t, Index h, Index d) {
    return static_cast<std::size_t>(((b * T + t) * KV + h) * D + d);
  };
  std::vector<double> out(in.q.size()), dq(in.q.size()), dk(in.k.size()), dv(in.v.size());
  std::vector<double> stats(r.stats.size());
  for (Index b = 0; b < c.b; ++b)
    for (Index h = 0; h < H; ++h)
      for (Index i = 0; i < T; ++i) {
        const Index kh = h / g;
        std::vector<double> p(static_cast<std::size_t>(i + 1)), dp(p.size());
        double m = -std::numeric_limits<double>::infinity();
        for (Index j = 0; j <= i; ++j) {
          double dot = 0.0, dot_v = 0.0;
          for (Index d = 0; d < D; ++d) {
            dot += static_cast<double>(in.q[at_q(b, i, h, d)]) * in.k[at_kv(b, j, kh, d)];
            dot_v += static_cast<double>(in.dout[at_q(b, i, h, d)]) * in.v[at_kv(b, j, kh, d)];
          }
          p[static_cast<std::size_t>(j)] = scale * dot;
          dp[static_cast<std::size_t>(j)] = dot_v;
          m = std::max(m, scale * dot);
        }
        double z = 0.0;
        for (auto& x : p)
          z += (x = std::exp(x - m));
        double rowsum = 0.0;  // sum_j p_j dp_j
        for (std::size_t j = 0; j < p.size(); ++j)
          rowsum += (p[j] /= z) * dp[j];
        stats[static_cast<std::size_t>((b * H + h) * T + i)] = m + std::log(z);
        for (Index j = 0; j <= i; ++j) {
          const double pj = p[static_cast<std::size_t>(j)];
          const double ds = pj * (dp[static_cast<std::size_t>(j)] - rowsum) * scale;
          for (Index d = 0; d < D; ++d) {
            out[at_q(b, i, h, d)] += pj * in.v[at_kv(b, j, kh, d)];
            dq[at_q(b, i, h, d)] += ds * in.k[at_kv(b, j, kh, d)];
            dk[at_kv(b, j, kh, d)] += ds * in.q[at_q(b, i, h, d)];
            dv[at_kv(b, j, kh, d)] += pj * in.dout[at_q(b, i, h, d)];
          }
        }
      }
  // f32 products and softmax against double: a few float roundings of O(1) terms.
  expect_close(r.out, out, 1e-5, 1e-5, "reference out");
  expect_close(r.dq, dq, 1e-5, 1e-5, "reference dq");
  expect_close(r.dk, dk, 1e-5, 1e-5, "reference dk");
  expect_close(r.dv, dv, 1e-5, 1e-5, "reference dv");
  // The reference's stats are exact functions of its f32 scores (1e-7 relative each).
  for (std::size_t i = 0; i < stats.size(); ++i)
    EXPECT_NEAR(r.stats[i], stats[i], 1e-5) << "reference stats[" << i << "]";
}

// --- argument checks: thrown before anything reaches the device, so these need none ----------

/// A "device" tensor over host memory: the checks under test throw before any launch or copy,
/// so the memory is never touched by CUDA (a device access would fault or fail loudly).
Tensor fake_device(Shape s) {
  static std::vector<float> memory(1 << 16);
  EXPECT_LE(s.numel(), static_cast<Index>(memory.size())) << "test bug: fake tensor too large";
  return Tensor{memory.data(), s, DType::f32, Device::cuda};
}

TEST(FusedAttentionChecks, NotSupportedForF32MathKokkosOrBadShapes) {
  const ExecContext bf16{tensor::Backend::cuda, nullptr, DType::bf16};
  EXPECT_FALSE(fused_attention_supported(ExecContext{tensor::Backend::cuda, nullptr, DType::f32}, 2,
                                         64, 4, 4, 64));
  EXPECT_FALSE(fused_attention_supported(ExecContext{tensor::Backend::kokkos, nullptr, DType::bf16},
                                         2, 64, 4, 4, 64));
  EXPECT_FALSE(fused_attention_supported(bf16, 2, 64, 6, 4, 64));  // H not a multiple of KV
  EXPECT_FALSE(fused_attention_supported(bf16, 2, 64, 4, 0, 64));
  EXPECT_FALSE(fused_attention_supported(bf16, 0, 64, 4, 4, 64));
  EXPECT_FALSE(fused_attention_supported(bf16, 2, 64, 4, 4, 60));   // D % 8 != 0
  EXPECT_FALSE(fused_attention_supported(bf16, 2, 64, 4, 4, 512));  // D > 256
  EXPECT_FALSE(fused_attention_supported(bf16, 2, 1, 4, 4, 64));    // T = 1 (no backward)
  if (!DSTRAIN_HAVE_CUDNN) {
    EXPECT_FALSE(fused_attention_supported(bf16, 2, 64, 4, 4, 64));
  }
}

TEST(FusedAttentionChecks, F32MathThrowsBeforeLaunch) {
  const Shape qs{1, 8, 2, 64}, ss{1, 2, 8};
  const ExecContext f32{tensor::Backend::cuda, nullptr, DType::f32};
  const Tensor q = fake_device(qs), st = fake_device(ss);
  const std::string fwd = error_of([&] { fused_attention_forward(f32, q, q, q, 0.125f, q, st); });
  const std::string bwd =
      error_of([&] { fused_attention_backward(f32, q, q, q, q, q, st, 0.125f, q, q, q); });
  for (const std::string& msg : {fwd, bwd}) {
    if (DSTRAIN_HAVE_CUDNN) {
      EXPECT_NE(msg.find("must be bf16 or f16"), std::string::npos) << msg;
    } else {
      EXPECT_NE(msg.find("no cuDNN"), std::string::npos) << msg;
    }
  }
  EXPECT_NE(fwd.find("fused_attention_forward"), std::string::npos) << fwd;
  EXPECT_NE(bwd.find("fused_attention_backward"), std::string::npos) << bwd;
}

TEST(FusedAttentionChecks, WrongShapesAndDevicesThrowBeforeLaunch) {
  if (!DSTRAIN_HAVE_CUDNN) GTEST_SKIP() << "built without cuDNN: the context check comes first";
  const ExecContext ctx{tensor::Backend::cuda, nullptr, DType::bf16};
  const Shape qs{1, 8, 2, 64}, ss{1, 2, 8};
  const Tensor q = fake_device(qs), st = fake_device(ss);
  // stats (B, T, H) instead of (B, H, T)
  const std::string stats_msg = error_of([&] {
    fused_attention_forward(ctx, q, q, q, 0.125f, q, fake_device({1, 8, 2}));
  });
  EXPECT_NE(stats_msg.find("stats: expected f32 (1, 2, 8)"), std::string::npos) << stats_msg;
  // 2 query heads cannot share 3 key/value heads
  const Tensor k3 = fake_device({1, 8, 3, 64});
  const std::string heads_msg =
      error_of([&] { fused_attention_forward(ctx, q, k3, k3, 0.125f, q, st); });
  EXPECT_NE(heads_msg.find("multiple of key/value heads"), std::string::npos) << heads_msg;
  // v of another length than k
  const std::string v_msg = error_of([&] {
    fused_attention_forward(ctx, q, q, fake_device({1, 7, 2, 64}), 0.125f, q, st);
  });
  EXPECT_NE(v_msg.find("fused_attention_forward: v: expected f32 (1, 8, 2, 64)"), std::string::npos)
      << v_msg;
  // a host tensor on the CUDA back end
  std::vector<float> host_q(static_cast<std::size_t>(qs.numel()));
  const std::string host_msg =
      error_of([&] { fused_attention_forward(ctx, view(host_q, qs), q, q, 0.125f, q, st); });
  EXPECT_NE(host_msg.find("tensor on host"), std::string::npos) << host_msg;
  // a non-finite scale
  const std::string scale_msg = error_of([&] {
    fused_attention_forward(ctx, q, q, q, std::numeric_limits<float>::infinity(), q, st);
  });
  EXPECT_NE(scale_msg.find("scale"), std::string::npos) << scale_msg;
  // the backward checks its gradients too: dk with the shape of q (2 heads over 1 kv head)
  const Tensor k1 = fake_device({1, 8, 1, 64});
  const std::string dk_msg =
      error_of([&] { fused_attention_backward(ctx, q, k1, k1, q, q, st, 0.125f, q, q, k1); });
  EXPECT_NE(dk_msg.find("fused_attention_backward: dk: expected f32 (1, 8, 1, 64)"),
            std::string::npos)
      << dk_msg;
}

}  // namespace
}  // namespace dst::kernels::test
