// The native CUDA back end (lib/kernels/cuda/) against the Kokkos back end, the reference:
// every kernel, forward and backward, on the same fixed-seed inputs, with edge shapes (one
// row, lengths that are not multiples of 4 or 32, a 102400-entry vocabulary, T = 1) and
// views at odd element offsets (the scalar fallback of the float4 paths).
//
// Bitwise comparisons where the two back ends evaluate the same float operations in the
// same order (data movement, the elementwise kernels, RoPE's rotation, AdamW, the 16-bit
// rounding, the embedding backward's ordered sums; the CUDA back end is built without FMA
// contraction for this) and where determinism is claimed (a second run; the same data at
// another alignment). The row reductions add their double partial sums in another order
// than Kokkos' lanes: a double rounding apart, so after the final rounding to float the
// results differ by at most an ulp or so of the quantities named at each tolerance.
//
// Needs a CUDA device: every test of the CudaVsKokkos fixture skips without one (CTest
// then reports it skipped). The CudaHostMath tests need none: they check the host
// instantiation of the back end's ported scalar math against the core originals.
// GoogleTest's own main, without the unit tests' FE_INVALID trap: the CUDA runtime's host
// code runs in this process, and the Kokkos reference is exercised under the trap by
// tests/unit/kernels already.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/bf16.hpp"
#include "error_of.hpp"
#include "kernels/cuda/detail/math.cuh"
#include "kernels_test_util.hpp"

namespace dst::kernels::test {
namespace {

using Index = std::int64_t;

/// One float ulp relative to the value, at its largest (just above a power of two).
constexpr double kUlp = 0x1p-23;

// --- device buffers ------------------------------------------------------------------------

void cuda_check(const cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw Error(std::string("kernels_cuda_test: ") + what + ": " + cudaGetErrorName(status) + " (" +
                cudaGetErrorString(status) + ")");
}

/// Spare elements after every buffer, so a view may start up to 3 elements in: not 16-byte
/// aligned, which sends the kernels down their scalar paths.
constexpr std::size_t kPad = 4;

template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t n) {
    void* p = nullptr;
    cuda_check(cudaMalloc(&p, (n + kPad) * sizeof(T)), "cudaMalloc");
    p_ = static_cast<T*>(p);
  }
  DeviceBuffer(const std::vector<T>& v, std::size_t offset = 0) : DeviceBuffer(v.size()) {
    upload(v, offset);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(p_); }

  void upload(const std::vector<T>& v, std::size_t offset = 0) const {
    cuda_check(cudaMemcpy(p_ + offset, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice),
               "upload");
  }
  /// Waits for all queued work first (the kernels run on the fixture's stream).
  std::vector<T> download(std::size_t n, std::size_t offset = 0) const {
    std::vector<T> v(n);
    cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    cuda_check(cudaMemcpy(v.data(), p_ + offset, n * sizeof(T), cudaMemcpyDeviceToHost),
               "download");
    return v;
  }
  Tensor view(Shape s, std::size_t offset = 0, DType dtype = dtype_of<T>::value) const {
    return Tensor{p_ + offset, s, dtype, Device::cuda};
  }

 private:
  T* p_ = nullptr;
};

// --- comparisons -----------------------------------------------------------------------------

std::uint32_t bits_of(const float f) {
  std::uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float float_of(const std::uint32_t u) {
  float f = 0.0f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

/// Distance in representable floats (for the failure report).
std::int64_t ulps_apart(const float a, const float b) {
  const auto key = [](float f) {
    const auto u = static_cast<std::int64_t>(bits_of(f));
    return u & 0x80000000 ? 0x80000000 - u : u;
  };
  return std::llabs(key(a) - key(b));
}

/// Bitwise equality, reporting the first differences and the largest distance in ulps.
void expect_same_bits(const std::vector<float>& actual, const std::vector<float>& expected,
                      const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  std::size_t differ = 0;
  std::int64_t worst = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    if (bits_of(actual[i]) == bits_of(expected[i])) continue;
    worst = std::max(worst, ulps_apart(actual[i], expected[i]));
    if (++differ <= 3)
      ADD_FAILURE() << what << "[" << i << "]: " << actual[i] << " (0x" << std::hex
                    << bits_of(actual[i]) << "), expected " << expected[i] << " (0x"
                    << bits_of(expected[i]) << std::dec << ")";
  }
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << actual.size()
                        << " elements differ, by up to " << worst << " ulp";
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (const float x : v)
    m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}

using dst::test::error_of;

std::vector<std::int32_t> random_ids(std::size_t n, Index v, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<std::int32_t> dist(0, static_cast<std::int32_t>(v - 1));
  std::vector<std::int32_t> ids(n);
  for (auto& id : ids)
    id = dist(gen);
  return ids;
}

std::vector<float> filled(std::size_t n, float value) {
  return std::vector<float>(n, value);
}

// --- the fixture -------------------------------------------------------------------------------

class CudaVsKokkos : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      (void)cudaGetLastError();
      GTEST_SKIP() << "no CUDA device: the CUDA back end cannot run here";
    }
  }

  /// One non-default stream for the whole program (the back end keeps scratch per stream).
  static ExecContext cuda() {
    static cudaStream_t stream = [] {
      cudaStream_t s = nullptr;
      cuda_check(cudaStreamCreate(&s), "cudaStreamCreate");
      return s;
    }();
    return ExecContext{tensor::Backend::cuda, stream};
  }
};

// --- embedding -----------------------------------------------------------------------------------

struct EmbeddingCase {
  Index n, c, v;
};

TEST_F(CudaVsKokkos, EmbeddingForwardIsBitwiseKokkos) {
  std::uint32_t seed = 100;
  for (const EmbeddingCase& e : {EmbeddingCase{1, 1, 1}, EmbeddingCase{7, 13, 260},
                                 EmbeddingCase{64, 256, 102400}, EmbeddingCase{33, 64, 1000}}) {
    const std::string what = "embedding_forward N=" + std::to_string(e.n) +
                             " C=" + std::to_string(e.c) + " V=" + std::to_string(e.v);
    auto tok = random_ids(static_cast<std::size_t>(e.n), e.v, seed++);
    auto wte = random_vec(static_cast<std::size_t>(e.v * e.c), seed++);
    auto ref = filled(static_cast<std::size_t>(e.n * e.c), -1.0f);
    embedding_forward(kokkos_ctx(), view(tok, {e.n}), view(wte, {e.v, e.c}), view(ref, {e.n, e.c}));
    for (const std::size_t offset : {0, 1}) {
      const DeviceBuffer<std::int32_t> dtok(tok);
      const DeviceBuffer<float> dwte(wte, offset);
      const DeviceBuffer<float> dout(filled(ref.size(), -1.0f), offset);
      embedding_forward(cuda(), dtok.view({e.n}), dwte.view({e.v, e.c}, offset),
                        dout.view({e.n, e.c}, offset));
      expect_same_bits(dout.download(ref.size(), offset), ref,
                       what + " offset " + std::to_string(offset));
    }
  }
}

TEST_F(CudaVsKokkos, EmbeddingBackwardIsBitwiseKokkosWithRepeatsAndSkew) {
  std::uint32_t seed = 200;
  for (const EmbeddingCase& e :
       {EmbeddingCase{1, 1, 1}, EmbeddingCase{300, 13, 260}, EmbeddingCase{1000, 200, 7},
        EmbeddingCase{2048, 64, 102400}, EmbeddingCase{513, 16, 50}}) {
    const std::string what = "embedding_backward N=" + std::to_string(e.n) +
                             " C=" + std::to_string(e.c) + " V=" + std::to_string(e.v);
    auto tok = random_ids(static_cast<std::size_t>(e.n), e.v, seed++);
    // Skew: every third token is the same id (a long run in the sorted order), and the
    // last id appears too (the sort's top bits).
    for (std::size_t i = 0; i < tok.size(); i += 3)
      tok[i] = static_cast<std::int32_t>(e.v / 2);
    tok.back() = static_cast<std::int32_t>(e.v - 1);
    auto dout = random_vec(static_cast<std::size_t>(e.n * e.c), seed++);
    const auto dwte0 = random_vec(static_cast<std::size_t>(e.v * e.c), seed++);  // accumulated
    auto ref = dwte0;
    embedding_backward(kokkos_ctx(), view(tok, {e.n}), view(dout, {e.n, e.c}),
                       view(ref, {e.v, e.c}));
    const DeviceBuffer<std::int32_t> dtok(tok);
    for (const std::size_t offset : {0, 0, 1}) {
      const DeviceBuffer<float> ddout(dout, offset);
      const DeviceBuffer<float> ddwte(dwte0, offset);
      embedding_backward(cuda(), dtok.view({e.n}), ddout.view({e.n, e.c}, offset),
                         ddwte.view({e.v, e.c}, offset));
      // Kokkos' order of additions exactly: bitwise, whatever the run or the alignment.
      expect_same_bits(ddwte.download(ref.size(), offset), ref,
                       what + " offset " + std::to_string(offset));
    }
  }
}

TEST_F(CudaVsKokkos, EmbeddingBadTokenGivesKokkosMessageAndWritesNothing) {
  const Index v = 260, c = 5, n = 6;
  auto wte = random_vec(static_cast<std::size_t>(v * c), 300);
  auto dout = random_vec(static_cast<std::size_t>(n * c), 301);
  // Two bad ids: the message names the first (position 2).
  auto tok = std::vector<std::int32_t>{1, 259, 300, 0, -1, 7};
  auto out_k = filled(static_cast<std::size_t>(n * c), -1.0f);
  const std::string fwd_k = error_of([&] {
    embedding_forward(kokkos_ctx(), view(tok, {n}), view(wte, {v, c}), view(out_k, {n, c}));
  });
  auto dwte_k = wte;
  const std::string bwd_k = error_of([&] {
    embedding_backward(kokkos_ctx(), view(tok, {n}), view(dout, {n, c}), view(dwte_k, {v, c}));
  });
  ASSERT_NE(fwd_k.find("token id 300 at position 2"), std::string::npos) << fwd_k;

  const DeviceBuffer<std::int32_t> dtok(tok);
  const DeviceBuffer<float> dwte(wte), ddout(dout), dout_buf(out_k);
  EXPECT_EQ(error_of([&] {
              embedding_forward(cuda(), dtok.view({n}), dwte.view({v, c}), dout_buf.view({n, c}));
            }),
            fwd_k);
  EXPECT_EQ(error_of([&] {
              embedding_backward(cuda(), dtok.view({n}), ddout.view({n, c}), dwte.view({v, c}));
            }),
            bwd_k);
  expect_same_bits(dout_buf.download(out_k.size()), out_k, "out after the error");
  expect_same_bits(dwte.download(wte.size()), wte, "dwte after the error");
}

// --- RMSNorm
// ---------------------------------------------------------------------------------------

struct RowCase {
  Index n, c;
};

TEST_F(CudaVsKokkos, RmsnormForwardMatchesKokkos) {
  std::uint32_t seed = 400;
  const float eps = 1e-5f;
  for (const RowCase& r : {RowCase{1, 1}, RowCase{5, 13}, RowCase{3, 64}, RowCase{300, 100},
                           RowCase{33, 4096}, RowCase{2, 7168}}) {
    const std::string what =
        "rmsnorm_forward N=" + std::to_string(r.n) + " C=" + std::to_string(r.c);
    auto x = random_vec(static_cast<std::size_t>(r.n * r.c), seed++, -2.0f, 2.0f);
    auto w = random_vec(static_cast<std::size_t>(r.c), seed++, 0.5f, 1.5f);
    auto out_k = filled(x.size(), -1.0f);
    auto rstd_k = filled(static_cast<std::size_t>(r.n), -1.0f);
    rmsnorm_forward(kokkos_ctx(), view(x, {r.n, r.c}), view(w, {r.c}), eps, view(out_k, {r.n, r.c}),
                    view(rstd_k, {r.n}));
    std::vector<float> out0, rstd0;
    for (const std::size_t offset : {0, 0, 1}) {
      const DeviceBuffer<float> dx(x, offset), dw(w, offset), dout(x.size()), drstd(rstd_k.size());
      rmsnorm_forward(cuda(), dx.view({r.n, r.c}, offset), dw.view({r.c}, offset), eps,
                      dout.view({r.n, r.c}, offset), drstd.view({r.n}));
      auto out = dout.download(x.size(), offset);
      auto rstd = drstd.download(rstd_k.size());
      if (out0.empty()) {
        // rstd is rounded once from a double whose sum order differs: at most one ulp
        // apart, doubled for the margin. out = x * rstd * w in float: that ulp of rstd plus
        // the two products' own roundings, 3 ulps; no cancellation, so relative.
        expect_close(rstd, to_double(rstd_k), 0, 2 * kUlp, what + " rstd");
        expect_close(out, to_double(out_k), 0, 3 * kUlp, what + " out");
        out0 = out, rstd0 = rstd;
      } else {
        expect_same_bits(out, out0, what + " out, rerun / offset " + std::to_string(offset));
        expect_same_bits(rstd, rstd0, what + " rstd, rerun / offset " + std::to_string(offset));
      }
    }
  }
}

TEST_F(CudaVsKokkos, RmsnormBackwardMatchesKokkos) {
  std::uint32_t seed = 500;
  // 5000 rows: dw's reduction spans several row chunks (chunks of >= 32 rows, <= 128 chunks).
  for (const RowCase& r : {RowCase{1, 1}, RowCase{1, 13}, RowCase{300, 13}, RowCase{5000, 64},
                           RowCase{40, 4096}, RowCase{3, 7168}}) {
    const std::string what =
        "rmsnorm_backward N=" + std::to_string(r.n) + " C=" + std::to_string(r.c);
    auto x = random_vec(static_cast<std::size_t>(r.n * r.c), seed++, -2.0f, 2.0f);
    auto w = random_vec(static_cast<std::size_t>(r.c), seed++, 0.5f, 1.5f);
    auto g = random_vec(x.size(), seed++);
    auto rstd = random_vec(static_cast<std::size_t>(r.n), seed++, 0.5f, 2.0f);
    const auto dx0 = random_vec(x.size(), seed++);  // both accumulate onto these
    const auto dw0 = random_vec(w.size(), seed++);
    auto dx_k = dx0, dw_k = dw0;
    rmsnorm_backward(kokkos_ctx(), view(g, {r.n, r.c}), view(x, {r.n, r.c}), view(w, {r.c}),
                     view(rstd, {r.n}), view(dx_k, {r.n, r.c}), view(dw_k, {r.c}));
    std::vector<float> dx_first, dw_first;
    for (const std::size_t offset : {0, 0, 1}) {
      const DeviceBuffer<float> dg(g, offset), dxin(x, offset), dw(w, offset), drstd(rstd),
          ddx(dx0, offset), ddw(dw0, offset);
      rmsnorm_backward(cuda(), dg.view({r.n, r.c}, offset), dxin.view({r.n, r.c}, offset),
                       dw.view({r.c}, offset), drstd.view({r.n}), ddx.view({r.n, r.c}, offset),
                       ddw.view({r.c}, offset));
      auto dx = ddx.download(x.size(), offset);
      auto dwv = ddw.download(w.size(), offset);
      if (dx_first.empty()) {
        // dx = dx0 + r (g w - xhat m): m = mean(g w xhat) is rounded from a double summed in
        // another order (one ulp of m at most), and g w - xhat m can cancel, so the error is
        // a few ulps of the row's largest terms, not of the element: 8 ulps of max |dx|.
        expect_close(dx, to_double(dx_k), 8 * kUlp * max_abs(dx_k), 0, what + " dx");
        // dw = dw0 + float(column sum in double): the chunked sum is a double rounding away
        // from Kokkos' single chain (one ulp of the sum after rounding), then one rounding
        // of the addition to dw0, which may cancel: 4 ulps of max |dw|.
        expect_close(dwv, to_double(dw_k), 4 * kUlp * max_abs(dw_k), 0, what + " dw");
        dx_first = dx, dw_first = dwv;
      } else {
        expect_same_bits(dx, dx_first, what + " dx, rerun / offset " + std::to_string(offset));
        expect_same_bits(dwv, dw_first, what + " dw, rerun / offset " + std::to_string(offset));
      }
    }
  }
}

// --- rotary embeddings ---------------------------------------------------------------------------

TEST_F(CudaVsKokkos, RopeTablesMatchKokkos) {
  struct Case {
    Index t, half;
    double theta;
  };
  for (const Case& k : {Case{1, 1, 1e4}, Case{100, 13, 1e6}, Case{4096, 64, 1e4}}) {
    const std::string what =
        "rope_tables T=" + std::to_string(k.t) + " D/2=" + std::to_string(k.half);
    auto cos_k = filled(static_cast<std::size_t>(k.t * k.half), 2.0f), sin_k = cos_k;
    rope_tables(kokkos_ctx(), k.theta, view(cos_k, {k.t, k.half}), view(sin_k, {k.t, k.half}));
    const DeviceBuffer<float> dcos(cos_k.size()), dsin(sin_k.size());
    rope_tables(cuda(), k.theta, dcos.view({k.t, k.half}), dsin.view({k.t, k.half}));
    // Both round a double to float; the device's double pow, cos and sin are within 2 double
    // ulps of the host's (angles up to 4096 rad: ~1e-12 absolute), so a value may round to
    // the other neighbour: one float ulp of a value <= 1, 2^-24, doubled for the margin.
    expect_close(dcos.download(cos_k.size()), to_double(cos_k), 0x1p-23, 0, what + " cos");
    expect_close(dsin.download(sin_k.size()), to_double(sin_k), 0x1p-23, 0, what + " sin");
  }
}

TEST_F(CudaVsKokkos, RopeRotationIsBitwiseKokkos) {
  struct Case {
    Index b, t, h, d;
  };
  std::uint32_t seed = 600;
  for (const Case& k :
       {Case{1, 1, 1, 2}, Case{2, 5, 3, 26}, Case{2, 64, 4, 128}, Case{1, 7, 2, 16}}) {
    const std::string what = "rope B=" + std::to_string(k.b) + " T=" + std::to_string(k.t) +
                             " H=" + std::to_string(k.h) + " D=" + std::to_string(k.d);
    const Index half = k.d / 2, t_table = k.t + 3;  // the tables cover more positions
    auto cos_t = filled(static_cast<std::size_t>(t_table * half), 0.0f), sin_t = cos_t;
    rope_tables(kokkos_ctx(), 1e4, view(cos_t, {t_table, half}), view(sin_t, {t_table, half}));
    const auto x = random_vec(static_cast<std::size_t>(k.b * k.t * k.h * k.d), seed++);
    const Shape shape{k.b, k.t, k.h, k.d};
    for (const bool inverse : {false, true}) {
      auto ref = x;
      (inverse ? rope_backward : rope_forward)(kokkos_ctx(), view(ref, shape),
                                               view(cos_t, {t_table, half}),
                                               view(sin_t, {t_table, half}));
      for (const std::size_t offset : {0, 1}) {
        const DeviceBuffer<float> dx(x, offset), dcos(cos_t, offset), dsin(sin_t, offset);
        (inverse ? rope_backward : rope_forward)(cuda(), dx.view(shape, offset),
                                                 dcos.view({t_table, half}, offset),
                                                 dsin.view({t_table, half}, offset));
        expect_same_bits(
            dx.download(x.size(), offset), ref,
            what + (inverse ? " backward" : " forward") + " offset " + std::to_string(offset));
      }
    }
  }
}

// --- causal softmax
// --------------------------------------------------------------------------------

TEST_F(CudaVsKokkos, CausalSoftmaxMatchesKokkos) {
  struct Case {
    Index bh, t;
  };
  std::uint32_t seed = 700;
  const float scale = 0.125f;
  for (const Case& k : {Case{1, 1}, Case{6, 5}, Case{2, 13}, Case{2, 64}, Case{3, 130},
                        Case{1, 1024}, Case{1, 2048}}) {
    const std::string what =
        "causal_softmax B*H=" + std::to_string(k.bh) + " T=" + std::to_string(k.t);
    const Shape shape{k.bh, k.t, k.t};
    const std::size_t size = static_cast<std::size_t>(k.bh * k.t * k.t);
    auto scores = random_vec(size, seed++, -8.0f, 8.0f);
    // Masked entries (j > i) hold NaN: neither back end may let them into a result.
    for (Index r = 0; r < k.bh * k.t; ++r)
      for (Index j = r % k.t + 1; j < k.t; ++j)
        scores[static_cast<std::size_t>(r * k.t + j)] = std::numeric_limits<float>::quiet_NaN();
    auto probs_k = filled(size, -1.0f);
    causal_softmax_forward(kokkos_ctx(), view(scores, shape), scale, view(probs_k, shape));
    auto dprobs = random_vec(size, seed++);
    auto ds_k = filled(size, -1.0f);
    causal_softmax_backward(kokkos_ctx(), view(probs_k, shape), view(dprobs, shape), scale,
                            view(ds_k, shape));

    std::vector<float> p_first, ds_first;
    for (const std::size_t offset : {0, 0, 1}) {
      const DeviceBuffer<float> ds_in(scores, offset), dp(size), ddp(dprobs, offset), dds(size),
          dprobs_k(probs_k, offset);
      causal_softmax_forward(cuda(), ds_in.view(shape, offset), scale, dp.view(shape, offset));
      // The backward from Kokkos' probabilities: its comparison does not inherit the
      // forward's differences.
      causal_softmax_backward(cuda(), dprobs_k.view(shape, offset), ddp.view(shape, offset), scale,
                              dds.view(shape, offset));
      auto p = dp.download(size, offset);
      auto ds = dds.download(size, offset);
      if (p_first.empty()) {
        // p = exp(scale s - max) * float(1 / sum): the exps are the same floats (same max,
        // same fast_exp); the double sum's order differs, so 1/sum may round to the other
        // neighbour: one ulp, plus the product's rounding. Exact zeros above the diagonal.
        expect_close(p, to_double(probs_k), 1e-44, 2 * kUlp, what + " probs");
        // ds = scale p (dp - dot): dot is rounded from a double summed in another order
        // (one ulp of |dot| <= 1), and dp - dot can cancel: absolute, a few ulps of scale.
        expect_close(ds, to_double(ds_k), 8 * kUlp * scale, 2 * kUlp, what + " dscores");
        p_first = p, ds_first = ds;
      } else {
        expect_same_bits(p, p_first, what + " probs, rerun / offset " + std::to_string(offset));
        expect_same_bits(ds, ds_first, what + " dscores, rerun / offset " + std::to_string(offset));
      }
    }
    // In place (probs aliasing scores, dscores aliasing dprobs): the same bits.
    const DeviceBuffer<float> inplace(scores), inplace_grad(dprobs), dprobs_k(probs_k);
    causal_softmax_forward(cuda(), inplace.view(shape), scale, inplace.view(shape));
    causal_softmax_backward(cuda(), dprobs_k.view(shape), inplace_grad.view(shape), scale,
                            inplace_grad.view(shape));
    expect_same_bits(inplace.download(size), p_first, what + " in-place probs");
    expect_same_bits(inplace_grad.download(size), ds_first, what + " in-place dscores");
  }
}

// --- SwiGLU
// ---------------------------------------------------------------------------------------

TEST_F(CudaVsKokkos, SwigluIsBitwiseKokkos) {
  std::uint32_t seed = 800;
  for (const Index n : {Index{1}, Index{13}, Index{4099}, Index{1} << 20}) {
    const std::string what = "swiglu n=" + std::to_string(n);
    auto h1 = random_vec(static_cast<std::size_t>(n), seed++, -12.0f, 12.0f);
    auto h3 = random_vec(h1.size(), seed++, -2.0f, 2.0f);
    auto g = random_vec(h1.size(), seed++);
    // Saturated gates (exp's clamps and the sigmoid's two branches).
    const float extremes[] = {-1000.0f, 1000.0f, -90.0f, 90.0f, -87.5f, 88.8f, 0.0f, -0.0f};
    for (std::size_t i = 0; i < h1.size() && i < 8; ++i)
      h1[i] = extremes[i];
    auto out_k = filled(h1.size(), -1.0f), dh1_k = out_k, dh3_k = out_k;
    swiglu_forward(kokkos_ctx(), view(h1, {n}), view(h3, {n}), view(out_k, {n}));
    swiglu_backward(kokkos_ctx(), view(g, {n}), view(h1, {n}), view(h3, {n}), view(dh1_k, {n}),
                    view(dh3_k, {n}));
    for (const std::size_t offset : {0, 1}) {
      const std::string at = what + " offset " + std::to_string(offset);
      const DeviceBuffer<float> d1(h1, offset), d3(h3, offset), dg(g, offset), dout(h1.size()),
          ddh1(h1.size()), ddh3(h1.size());
      swiglu_forward(cuda(), d1.view({n}, offset), d3.view({n}, offset), dout.view({n}, offset));
      swiglu_backward(cuda(), dg.view({n}, offset), d1.view({n}, offset), d3.view({n}, offset),
                      ddh1.view({n}, offset), ddh3.view({n}, offset));
      expect_same_bits(dout.download(h1.size(), offset), out_k, at + " out");
      expect_same_bits(ddh1.download(h1.size(), offset), dh1_k, at + " dh1");
      expect_same_bits(ddh3.download(h1.size(), offset), dh3_k, at + " dh3");
      // dh1/dh3 aliasing h1/h3.
      swiglu_backward(cuda(), dg.view({n}, offset), d1.view({n}, offset), d3.view({n}, offset),
                      d1.view({n}, offset), d3.view({n}, offset));
      expect_same_bits(d1.download(h1.size(), offset), dh1_k, at + " in-place dh1");
      expect_same_bits(d3.download(h1.size(), offset), dh3_k, at + " in-place dh3");
    }
  }
}

// --- DeepSeekMoE token movement ------------------------------------------------------------

/// K distinct random experts per token, the (token, slot) pairs sorted stably by expert as
/// the router's sort_by_expert: token (R) of each row, row (N, K) of each slot.
void moe_routing(Index n, Index k, Index experts, std::uint32_t seed,
                 std::vector<std::int32_t>& token, std::vector<std::int32_t>& row) {
  std::mt19937 gen(seed);
  std::vector<std::int32_t> idx(static_cast<std::size_t>(n * k));
  std::vector<std::int32_t> all(static_cast<std::size_t>(experts));
  for (Index e = 0; e < experts; ++e)
    all[static_cast<std::size_t>(e)] = static_cast<std::int32_t>(e);
  for (Index t = 0; t < n; ++t) {
    std::shuffle(all.begin(), all.end(), gen);
    std::copy(all.begin(), all.begin() + k, idx.begin() + t * k);
  }
  std::vector<Index> order(idx.size());
  for (std::size_t p = 0; p < order.size(); ++p)
    order[p] = static_cast<Index>(p);
  std::stable_sort(order.begin(), order.end(), [&](Index a, Index b) {
    return idx[static_cast<std::size_t>(a)] < idx[static_cast<std::size_t>(b)];
  });
  token.assign(idx.size(), 0);
  row.assign(idx.size(), 0);
  for (std::size_t p = 0; p < order.size(); ++p) {
    token[p] = static_cast<std::int32_t>(order[p] / k);
    row[static_cast<std::size_t>(order[p])] = static_cast<std::int32_t>(p);
  }
}

// The gather, its transpose, the combine and d_y add the same floats in the same slot order
// as Kokkos: bitwise. d_weights is a double dot product summed in another order, rounded
// to float: within an ulp of its magnitude.
TEST_F(CudaVsKokkos, MoeTokenMovementIsBitwiseKokkos) {
  struct Case {
    Index n, k, c, experts;
  };
  std::uint32_t seed = 1700;
  for (const Case cs : {Case{1, 1, 4, 2}, Case{37, 2, 13, 8}, Case{1000, 8, 256, 64}}) {
    const Index n = cs.n, k = cs.k, c = cs.c, r = n * k;
    std::vector<std::int32_t> token, row;
    moe_routing(n, k, cs.experts, seed++, token, row);
    auto x = random_vec(static_cast<std::size_t>(n * c), seed++);
    auto y = random_vec(static_cast<std::size_t>(r * c), seed++);
    auto w = random_vec(static_cast<std::size_t>(r), seed++, 0.0f, 1.0f);
    auto dout = random_vec(static_cast<std::size_t>(n * c), seed++);
    auto base = random_vec(static_cast<std::size_t>(n * c), seed++);  // accumulated into
    auto xs_k = filled(static_cast<std::size_t>(r * c), -1.0f);
    auto dx_k = base, out_k = base;
    auto dy_k = filled(static_cast<std::size_t>(r * c), -1.0f), dw_k = filled(w.size(), -1.0f);
    gather_rows(kokkos_ctx(), view(x, {n, c}), view(token, {r}), view(xs_k, {r, c}));
    gather_rows_backward(kokkos_ctx(), view(y, {r, c}), view(row, {n, k}), view(dx_k, {n, c}));
    moe_combine_forward(kokkos_ctx(), view(y, {r, c}), view(row, {n, k}), view(w, {n, k}),
                        view(out_k, {n, c}));
    moe_combine_backward(kokkos_ctx(), view(dout, {n, c}), view(y, {r, c}), view(row, {n, k}),
                         view(w, {n, k}), view(dy_k, {r, c}), view(dw_k, {n, k}));
    const DeviceBuffer<std::int32_t> dtoken(token), drow(row);
    for (const std::size_t offset : {0, 1}) {
      const std::string at = "moe n=" + std::to_string(n) + " k=" + std::to_string(k) +
                             " c=" + std::to_string(c) + " offset " + std::to_string(offset);
      const DeviceBuffer<float> dx_in(x, offset), dy_in(y, offset), dw(w, offset),
          ddout(dout, offset), dxs(y.size()), ddx(base, offset), dout_acc(base, offset),
          ddy(y.size()), ddw(w.size());
      gather_rows(cuda(), dx_in.view({n, c}, offset), dtoken.view({r}), dxs.view({r, c}, offset));
      gather_rows_backward(cuda(), dy_in.view({r, c}, offset), drow.view({n, k}),
                           ddx.view({n, c}, offset));
      moe_combine_forward(cuda(), dy_in.view({r, c}, offset), drow.view({n, k}),
                          dw.view({n, k}, offset), dout_acc.view({n, c}, offset));
      moe_combine_backward(cuda(), ddout.view({n, c}, offset), dy_in.view({r, c}, offset),
                           drow.view({n, k}), dw.view({n, k}, offset), ddy.view({r, c}, offset),
                           ddw.view({n, k}, offset));
      expect_same_bits(dxs.download(y.size(), offset), xs_k, at + " gather");
      expect_same_bits(ddx.download(base.size(), offset), dx_k, at + " gather backward");
      expect_same_bits(dout_acc.download(base.size(), offset), out_k, at + " combine");
      expect_same_bits(ddy.download(y.size(), offset), dy_k, at + " d_y");
      const auto dw_c = ddw.download(w.size(), offset);
      for (std::size_t i = 0; i < w.size(); ++i)
        ASSERT_LE(std::fabs(static_cast<double>(dw_c[i]) - dw_k[i]),
                  kUlp * std::fabs(static_cast<double>(dw_k[i])) + 1e-30)
            << at << " d_weights[" << i << "]: " << dw_c[i] << " vs " << dw_k[i];
    }
  }
}

// --- cross-entropy
// ---------------------------------------------------------------------------------

constexpr std::int32_t kIgnore = -100;

TEST_F(CudaVsKokkos, CrossEntropyMatchesKokkos) {
  struct Case {
    Index n, v;
    float lo, hi;  // logit range
  };
  std::uint32_t seed = 900;
  for (const Case& k :
       {Case{1, 1, -1, 1}, Case{4, 13, -5, 5}, Case{6, 260, -5, 5}, Case{3, 102400, -10, 10},
        Case{2, 102401, -10, 10}, Case{5, 16, -3e4f, 3e4f}}) {
    const std::string what = "cross_entropy N=" + std::to_string(k.n) + " V=" + std::to_string(k.v);
    auto logits = random_vec(static_cast<std::size_t>(k.n * k.v), seed++, k.lo, k.hi);
    auto tg = random_ids(static_cast<std::size_t>(k.n), k.v, seed++);
    if (k.n > 2) tg[1] = kIgnore;  // an ignored row among counted ones
    tg.back() = static_cast<std::int32_t>(k.v - 1);
    const float grad_scale = 1.0f / static_cast<float>(k.n);
    auto loss_k = filled(tg.size(), -1.0f), fused_loss_k = loss_k;
    auto dl_k = filled(logits.size(), -1.0f);
    cross_entropy_forward(kokkos_ctx(), view(logits, {k.n, k.v}), view(tg, {k.n}), kIgnore,
                          view(loss_k, {k.n}));
    cross_entropy_fused(kokkos_ctx(), view(logits, {k.n, k.v}), view(tg, {k.n}), kIgnore,
                        grad_scale, view(fused_loss_k, {k.n}), view(dl_k, {k.n, k.v}));
    const DeviceBuffer<std::int32_t> dtg(tg);
    std::vector<float> loss_first, dl_first;
    for (const std::size_t offset : {0, 0, 1}) {
      const DeviceBuffer<float> dlogits(logits, offset), dloss(tg.size()), dfused(tg.size()),
          ddl(filled(logits.size(), -1.0f), offset);
      cross_entropy_forward(cuda(), dlogits.view({k.n, k.v}, offset), dtg.view({k.n}), kIgnore,
                            dloss.view({k.n}));
      cross_entropy_fused(cuda(), dlogits.view({k.n, k.v}, offset), dtg.view({k.n}), kIgnore,
                          grad_scale, dfused.view({k.n}), ddl.view({k.n, k.v}, offset));
      auto loss = dloss.download(tg.size());
      auto fused_loss = dfused.download(tg.size());
      auto dl = ddl.download(logits.size(), offset);
      // The forward and the fused kernel compute the loss the same way.
      expect_same_bits(fused_loss, loss, what + " fused vs forward losses");
      if (loss_first.empty()) {
        // loss = float(log(sum) + max - l[t]) in double: the device's log and the sum's
        // order move the double by ~1e-16 relative, so the float may round to the other
        // neighbour: one ulp, doubled; exact zeros for ignored rows.
        expect_close(loss, to_double(loss_k), 1e-30, 2 * kUlp, what + " losses");
        // exp(l - max) * float(grad_scale / sum): the factor may be one ulp off, plus the
        // product's rounding; at the target, minus grad_scale, which can cancel: absolute,
        // 2 ulps of grad_scale.
        expect_close(dl, to_double(dl_k), 2 * kUlp * grad_scale, 2 * kUlp, what + " dlogits");
        loss_first = loss, dl_first = dl;
      } else {
        expect_same_bits(loss, loss_first,
                         what + " losses, rerun / offset " + std::to_string(offset));
        expect_same_bits(dl, dl_first, what + " dlogits, rerun / offset " + std::to_string(offset));
      }
    }
    // dlogits aliasing logits (the logits buffer becomes its gradient): the same bits.
    const DeviceBuffer<float> inplace(logits), dloss(tg.size());
    cross_entropy_fused(cuda(), inplace.view({k.n, k.v}), dtg.view({k.n}), kIgnore, grad_scale,
                        dloss.view({k.n}), inplace.view({k.n, k.v}));
    expect_same_bits(inplace.download(logits.size()), dl_first, what + " in-place dlogits");
    expect_same_bits(dloss.download(tg.size()), loss_first, what + " in-place losses");
  }
}

// A vocabulary split over a tensor group (kernels.hpp, "vocabulary slices"): the slice's
// embedding and the cross-entropy's passes on one rank's columns (the group's collectives
// are the caller's), against the Kokkos kernels on the same slice: the same operations in
// the same order (Kokkos' lane order included), so bit for bit but for the device's log
// in the losses (one ulp, as the whole-vocabulary kernel).
TEST_F(CudaVsKokkos, VocabSliceKernelsAreBitwiseKokkos) {
  const Index n = 37, c = 12, v = 1000, first = 250, count = 250;
  std::uint32_t seed = 1500;
  auto tok = random_ids(static_cast<std::size_t>(n), v, seed++);
  tok[3] = static_cast<std::int32_t>(first);              // the slice's first row
  tok[4] = static_cast<std::int32_t>(first + count - 1);  // and its last
  tok[5] = tok[4];                                        // a repeat (accumulation order)
  auto wte = random_vec(static_cast<std::size_t>(count * c), seed++);
  auto out_k = filled(static_cast<std::size_t>(n * c), 1.0f);
  embedding_slice_forward(kokkos_ctx(), view(tok, {n}), view(wte, {count, c}), first, v,
                          view(out_k, {n, c}));
  const DeviceBuffer<std::int32_t> dtok(tok);
  const DeviceBuffer<float> dwte(wte), dout(filled(out_k.size(), 1.0f));
  embedding_slice_forward(cuda(), dtok.view({n}), dwte.view({count, c}), first, v,
                          dout.view({n, c}));
  expect_same_bits(dout.download(out_k.size()), out_k, "embedding_slice_forward");

  auto grad = random_vec(static_cast<std::size_t>(n * c), seed++);
  auto dwte_k = random_vec(wte.size(), seed++);  // accumulated onto
  const DeviceBuffer<float> dgrad(grad), ddwte(dwte_k);
  embedding_slice_backward(kokkos_ctx(), view(tok, {n}), view(grad, {n, c}), first, v,
                           view(dwte_k, {count, c}));
  embedding_slice_backward(cuda(), dtok.view({n}), dgrad.view({n, c}), first, v,
                           ddwte.view({count, c}));
  expect_same_bits(ddwte.download(dwte_k.size()), dwte_k, "embedding_slice_backward");

  auto tg = random_ids(static_cast<std::size_t>(n), v, seed++);
  tg[1] = kIgnore;
  tg[2] = static_cast<std::int32_t>(first + 7);  // a target the slice holds
  for (const bool with_gradient : {false, true}) {
    const std::string what =
        with_gradient ? "cross_entropy_slice (gradient)" : "cross_entropy_slice";
    auto logits_k = random_vec(static_cast<std::size_t>(n * count), seed++, -5.0f, 5.0f);
    const DeviceBuffer<float> dlogits(logits_k);
    const DeviceBuffer<std::int32_t> dtg(tg), dkeys(static_cast<std::size_t>(n));
    const DeviceBuffer<double> dsums(2 * static_cast<std::size_t>(n));
    const DeviceBuffer<float> dloss(static_cast<std::size_t>(n));
    std::vector<std::int32_t> keys_k(static_cast<std::size_t>(n));
    std::vector<double> sums_k(2 * static_cast<std::size_t>(n));
    auto loss_k = filled(static_cast<std::size_t>(n), -1.0f);
    cross_entropy_slice_max(kokkos_ctx(), view(logits_k, {n, count}), view(tg, {n}), kIgnore, v,
                            view(keys_k, {n}));
    cross_entropy_slice_max(cuda(), dlogits.view({n, count}), dtg.view({n}), kIgnore, v,
                            dkeys.view({n}));
    EXPECT_EQ(dkeys.download(keys_k.size()), keys_k) << what << " keys";
    cross_entropy_slice_sums(kokkos_ctx(), view(logits_k, {n, count}), view(keys_k, {n}),
                             view(tg, {n}), kIgnore, first, with_gradient, view(sums_k, {n, 2}));
    cross_entropy_slice_sums(cuda(), dlogits.view({n, count}), dkeys.view({n}), dtg.view({n}),
                             kIgnore, first, with_gradient, dsums.view({n, 2}));
    const std::vector<double> sums = dsums.download(sums_k.size());
    EXPECT_EQ(0, std::memcmp(sums.data(), sums_k.data(), sums.size() * sizeof(double)))
        << what << " sums";
    cross_entropy_slice_finish(kokkos_ctx(), view(logits_k, {n, count}), view(keys_k, {n}),
                               view(sums_k, {n, 2}), view(tg, {n}), kIgnore, first, 0.25f,
                               with_gradient, view(loss_k, {n}));
    cross_entropy_slice_finish(cuda(), dlogits.view({n, count}), dkeys.view({n}),
                               dsums.view({n, 2}), dtg.view({n}), kIgnore, first, 0.25f,
                               with_gradient, dloss.view({n}));
    expect_same_bits(dlogits.download(logits_k.size()), logits_k, what + " logits");
    expect_close(dloss.download(loss_k.size()), to_double(loss_k), 1e-30, 2 * kUlp,
                 what + " losses");
  }
}

TEST_F(CudaVsKokkos, CrossEntropyAllIgnoredRowsAreZero) {
  const Index n = 3, v = 260;
  const std::vector<std::int32_t> tg(static_cast<std::size_t>(n), kIgnore);
  const auto logits = random_vec(static_cast<std::size_t>(n * v), 950);
  const DeviceBuffer<std::int32_t> dtg(tg);
  const DeviceBuffer<float> dlogits(logits), dloss(filled(tg.size(), -1.0f)),
      ddl(filled(logits.size(), -1.0f));
  cross_entropy_fused(cuda(), dlogits.view({n, v}), dtg.view({n}), kIgnore, 0.5f, dloss.view({n}),
                      ddl.view({n, v}));
  expect_same_bits(dloss.download(tg.size()), filled(tg.size(), 0.0f), "losses");
  expect_same_bits(ddl.download(logits.size()), filled(logits.size(), 0.0f), "dlogits");
}

TEST_F(CudaVsKokkos, CrossEntropyBadTargetGivesKokkosMessageAndWritesNothing) {
  const Index n = 5, v = 260;
  auto logits = random_vec(static_cast<std::size_t>(n * v), 960);
  // Two bad targets: the message names the first (-1 at position 2).
  auto tg = std::vector<std::int32_t>{0, kIgnore, -1, 260, 5};
  auto loss_k = filled(tg.size(), -1.0f), dl_k = filled(logits.size(), -1.0f);
  const std::string fwd_k = error_of([&] {
    cross_entropy_forward(kokkos_ctx(), view(logits, {n, v}), view(tg, {n}), kIgnore,
                          view(loss_k, {n}));
  });
  const std::string fused_k = error_of([&] {
    cross_entropy_fused(kokkos_ctx(), view(logits, {n, v}), view(tg, {n}), kIgnore, 1.0f,
                        view(loss_k, {n}), view(dl_k, {n, v}));
  });
  ASSERT_NE(fwd_k.find("target -1 at position 2"), std::string::npos) << fwd_k;
  const DeviceBuffer<std::int32_t> dtg(tg);
  const DeviceBuffer<float> dlogits(logits), dloss(loss_k), ddl(dl_k);
  EXPECT_EQ(error_of([&] {
              cross_entropy_forward(cuda(), dlogits.view({n, v}), dtg.view({n}), kIgnore,
                                    dloss.view({n}));
            }),
            fwd_k);
  EXPECT_EQ(error_of([&] {
              cross_entropy_fused(cuda(), dlogits.view({n, v}), dtg.view({n}), kIgnore, 1.0f,
                                  dloss.view({n}), ddl.view({n, v}));
            }),
            fused_k);
  expect_same_bits(dloss.download(loss_k.size()), loss_k, "losses after the error");
  expect_same_bits(ddl.download(dl_k.size()), dl_k, "dlogits after the error");
}

// --- elementwise
// ------------------------------------------------------------------------------------

TEST_F(CudaVsKokkos, AddAccumulateScaleAreBitwiseKokkos) {
  std::uint32_t seed = 1000;
  for (const Index n : {Index{1}, Index{13}, (Index{1} << 16) + 3}) {
    const std::string what = "n=" + std::to_string(n);
    auto a = random_vec(static_cast<std::size_t>(n), seed++);
    auto b = random_vec(a.size(), seed++);
    auto sum_k = filled(a.size(), -1.0f), acc_k = b, scaled_k = a;
    add(kokkos_ctx(), view(a, {n}), view(b, {n}), view(sum_k, {n}));
    accumulate(kokkos_ctx(), view(a, {n}), view(acc_k, {n}));
    scale(kokkos_ctx(), view(scaled_k, {n}), 0.37f);
    for (const std::size_t offset : {0, 1, 3}) {
      const std::string at = what + " offset " + std::to_string(offset);
      const DeviceBuffer<float> da(a, offset), db(b, offset), dsum(a.size()), dscaled(a, offset);
      add(cuda(), da.view({n}, offset), db.view({n}, offset), dsum.view({n}, offset));
      expect_same_bits(dsum.download(a.size(), offset), sum_k, at + " add");
      scale(cuda(), dscaled.view({n}, offset), 0.37f);
      expect_same_bits(dscaled.download(a.size(), offset), scaled_k, at + " scale");
      accumulate(cuda(), da.view({n}, offset), db.view({n}, offset));
      expect_same_bits(db.download(a.size(), offset), acc_k, at + " accumulate");
      add(cuda(), da.view({n}, offset), da.view({n}, offset), da.view({n}, offset));  // out = a
      std::vector<float> doubled(a.size());
      for (std::size_t i = 0; i < a.size(); ++i)
        doubled[i] = a[i] + a[i];
      expect_same_bits(da.download(a.size(), offset), doubled, at + " add in place");
    }
  }
}

TEST_F(CudaVsKokkos, ZeroClearsEveryWidth) {
  // Odd counts and offsets for 4-, 2- and 1-byte elements.
  const DeviceBuffer<float> f(filled(13, 1.5f), 1);
  zero(cuda(), f.view({13}, 1));
  expect_same_bits(f.download(13, 1), filled(13, 0.0f), "f32");
  const DeviceBuffer<std::int32_t> i(std::vector<std::int32_t>(7, -3));
  zero(cuda(), i.view({7}));
  EXPECT_EQ(i.download(7), std::vector<std::int32_t>(7, 0)) << "i32";
  const DeviceBuffer<std::uint16_t> h(std::vector<std::uint16_t>(5, 0x3f80));
  zero(cuda(), h.view({5}, 1, DType::bf16));
  EXPECT_EQ(h.download(6), (std::vector<std::uint16_t>{0x3f80, 0, 0, 0, 0, 0})) << "bf16";
  const DeviceBuffer<std::uint8_t> u(std::vector<std::uint8_t>(9, 0xab));
  zero(cuda(), u.view({9}));
  EXPECT_EQ(u.download(9), std::vector<std::uint8_t>(9, 0)) << "u8";
}

/// Every bf16 and f16 rounding boundary region: each 16-bit pattern's value and its
/// neighbours and midpoints, both signs; NaNs with payloads (signalling and quiet); random
/// bit patterns.
std::vector<float> rounding_samples() {
  std::vector<float> x;
  for (std::uint32_t h = 0; h < 0x8000; ++h) {
    const std::uint32_t b = h << 16;  // a bf16 value
    for (const std::uint32_t u : {b, b + 0x7fff, b + 0x8000, b + 0x8001})
      x.push_back(float_of(u)), x.push_back(float_of(u | 0x80000000u));
  }
  for (std::uint32_t h = 0; h < 0x7c00; ++h) {  // every finite half, exactly and +- half ulp
    const float v = f16{static_cast<std::uint16_t>(h)}.to_float();
    const std::uint32_t u = bits_of(v);
    for (const std::uint32_t d : {0u, 1u, 0xfffu, 0x1000u, 0x1001u})
      x.push_back(float_of(u + d)), x.push_back(-float_of(u + d));
  }
  for (const std::uint32_t nan :
       {0x7f800001u, 0x7fa00000u, 0x7fc00000u, 0x7fc01234u, 0xff812345u, 0x7f800000u, 0xff800000u})
    x.push_back(float_of(nan));
  std::mt19937 gen(1100);
  for (int i = 0; i < 100000; ++i)
    x.push_back(float_of(static_cast<std::uint32_t>(gen())));
  return x;
}

TEST_F(CudaVsKokkos, RoundToStorageIsBitwiseKokkosIncludingNaNs) {
  const auto x = rounding_samples();
  const auto n = static_cast<Index>(x.size());
  for (const DType storage : {DType::bf16, DType::f16}) {
    auto ref = x;
    round_to_storage(kokkos_ctx(), view(ref, {n}), storage);
    for (const std::size_t offset : {0, 1}) {
      // Integer arithmetic on the bits on both sides: NaN payloads too.
      const DeviceBuffer<float> dx(x, offset);
      round_to_storage(cuda(), dx.view({n}, offset), storage);
      expect_same_bits(dx.download(x.size(), offset), ref,
                       std::string(dtype_name(storage)) + " offset " + std::to_string(offset));
    }
  }
}

// --- norms
// ----------------------------------------------------------------------------------------

TEST_F(CudaVsKokkos, SumOfSquaresMatchesKokkosAndIsDeterministic) {
  std::uint32_t seed = 1200;
  for (const Index n : {Index{1}, Index{13}, Index{8191}, Index{8193}, (Index{1} << 22) + 5}) {
    const std::string what = "sum_of_squares n=" + std::to_string(n);
    auto x = random_vec(static_cast<std::size_t>(n), seed++, -3.0f, 3.0f);
    const double ref = sum_of_squares(kokkos_ctx(), view(x, {n}));
    const DeviceBuffer<float> d0(x, 0), d1(x, 1);
    const double got = sum_of_squares(cuda(), d0.view({n}));
    // Positive terms summed in double in two orders: each within n * 2^-53 relative of the
    // exact sum, so within twice that of each other.
    EXPECT_NEAR(got, ref, 2.0 * static_cast<double>(n) * 0x1p-53 * ref) << what;
    // Determinism: a rerun, the same data at another alignment, the legacy default stream.
    const double again = sum_of_squares(cuda(), d0.view({n}));
    const double shifted = sum_of_squares(cuda(), d1.view({n}, 1));
    const double default_stream =
        sum_of_squares(ExecContext{tensor::Backend::cuda, nullptr}, d0.view({n}));
    EXPECT_EQ(std::memcmp(&got, &again, sizeof got), 0) << what << " rerun";
    EXPECT_EQ(std::memcmp(&got, &shifted, sizeof got), 0) << what << " offset 1";
    EXPECT_EQ(std::memcmp(&got, &default_stream, sizeof got), 0) << what << " default stream";
  }
}

// The variant that does not wait: the CUDA blocking sum's bits, in a device f64 slot.
TEST_F(CudaVsKokkos, SumOfSquaresIntoHasTheBlockingSumsBits) {
  std::uint32_t seed = 1230;
  const Index sizes[] = {1, 13, 8193, (Index{1} << 22) + 5};
  const std::vector<double> init(5, -1.0);
  const DeviceBuffer<double> dout(init);
  for (std::size_t i = 0; i < std::size(sizes); ++i) {
    const Index n = sizes[i];
    auto x = random_vec(static_cast<std::size_t>(n), seed++, -3.0f, 3.0f);
    const DeviceBuffer<float> dx(x);
    sum_of_squares_into(cuda(), dx.view({n}), dout.view({5}), static_cast<Index>(i));
    const double ref = sum_of_squares(cuda(), dx.view({n}));
    const auto got = dout.download(5);
    EXPECT_EQ(std::memcmp(&got[i], &ref, sizeof ref), 0) << "n=" << n;
    EXPECT_EQ(got[i + 1], -1.0) << "slot " << i + 1 << " written";
  }
  sum_of_squares_into(cuda(), Tensor{nullptr, Shape{0}, DType::f32, Device::cuda}, dout.view({5}),
                      4);
  EXPECT_EQ(dout.download(5)[4], 0.0);
}

TEST_F(CudaVsKokkos, SumOfSquaresPropagatesNonFinite) {
  auto x = random_vec(1000, 1250);
  x[777] = std::numeric_limits<float>::infinity();
  const DeviceBuffer<float> dinf(x);
  EXPECT_EQ(sum_of_squares(cuda(), dinf.view({1000})), std::numeric_limits<double>::infinity());
  x[3] = std::numeric_limits<float>::quiet_NaN();
  const DeviceBuffer<float> dnan(x);
  EXPECT_TRUE(std::isnan(sum_of_squares(cuda(), dnan.view({1000}))));
}

TEST_F(CudaVsKokkos, FirstNonfiniteMatchesKokkos) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float snan = float_of(0x7f800001u);
  struct Case {
    Index n;
    std::vector<std::pair<Index, float>> bad;
  };
  const Index big = (Index{1} << 22) + 3;
  for (const Case& k :
       {Case{1, {}}, Case{1, {{0, nan}}}, Case{13, {{12, -inf}}}, Case{13, {{9, snan}, {4, inf}}},
        Case{big, {}}, Case{big, {{big - 1, nan}, {3000001, -inf}, {3000002, nan}}}}) {
    auto x = random_vec(static_cast<std::size_t>(k.n), 1300);
    for (const auto& [pos, value] : k.bad)
      x[static_cast<std::size_t>(pos)] = value;
    const Index ref = first_nonfinite(kokkos_ctx(), view(x, {k.n}));
    for (const std::size_t offset : {0, 1})
      EXPECT_EQ(first_nonfinite(cuda(), DeviceBuffer<float>(x, offset).view({k.n}, offset)), ref)
          << "n=" << k.n << " offset " << offset;
  }
}

// The asynchronous scan lowers a device flag exactly as the Kokkos one lowers a host flag,
// over a series of ranges of one buffer (what GradBuckets does with a step's buckets).
TEST_F(CudaVsKokkos, FirstNonfiniteMinMatchesKokkosOverASeries) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Index n = (Index{1} << 20) + 5;
  auto x = random_vec(static_cast<std::size_t>(n), 1310);
  x[900001] = nan;
  x[300007] = -std::numeric_limits<float>::infinity();
  const std::uint64_t none = std::numeric_limits<std::uint64_t>::max();
  std::vector<std::uint64_t> host_flag{none};
  const DeviceBuffer<float> dx(x);
  const DeviceBuffer<std::uint64_t> dflag(host_flag);
  const Index per = 250000;
  for (Index end = n; end > 0; end -= std::min(end, per)) {  // from the end, as backward
    const Index begin = end > per ? end - per : 0;
    std::vector<float> part(x.begin() + begin, x.begin() + end);
    first_nonfinite_min(kokkos_ctx(), view(part, {end - begin}), static_cast<std::uint64_t>(begin),
                        view(host_flag, {1}));
    Tensor range = dx.view({n});
    range.data = static_cast<float*>(range.data) + begin;
    range.shape = Shape{end - begin};
    first_nonfinite_min(cuda(), range, static_cast<std::uint64_t>(begin), dflag.view({1}));
  }
  EXPECT_EQ(host_flag[0], 300007u);
  EXPECT_EQ(dflag.download(1)[0], host_flag[0]);
}

// --- AdamW
// ----------------------------------------------------------------------------------------

TEST_F(CudaVsKokkos, AdamwIsBitwiseKokkosOverSteps) {
  std::uint32_t seed = 1400;
  for (const Index n : {Index{1}, Index{13}, (Index{1} << 16) + 3}) {
    // beta1 = 0.9: lerp weight 0.1 < 0.5 (the self + w (end - self) form); 0.3: the other.
    for (const double beta1 : {0.9, 0.3}) {
      const std::string what = "adamw n=" + std::to_string(n) + " beta1=" + std::to_string(beta1);
      const auto p0 = random_vec(static_cast<std::size_t>(n), seed++);
      for (const std::size_t offset : {0, 1}) {
        auto p = p0, m = filled(p0.size(), 0.0f), v = m;
        const DeviceBuffer<float> dp(p0, offset), dm(m, offset), dv(m, offset), dg(p0.size());
        AdamWHyper h;
        h.beta1 = beta1;
        h.beta2 = 0.95;
        h.eps = 1e-8;
        h.weight_decay = 0.1;
        h.grad_scale = 0.37;
        for (const std::int64_t step : {1, 2, 3, 10, 1000}) {
          h.step = step;
          h.lr = 1e-3 * (1.0 + 0.1 * static_cast<double>(step));
          auto g = random_vec(p0.size(), seed++, -2.0f, 2.0f);
          if (n > 5) g[5] = 0.0f;  // a zero gradient: v may reach 0 (eps alone divides)
          adamw_step(kokkos_ctx(), view(p, {n}), view(g, {n}), view(m, {n}), view(v, {n}), h);
          dg.upload(g, offset);
          adamw_step(cuda(), dp.view({n}, offset), dg.view({n}, offset), dm.view({n}, offset),
                     dv.view({n}, offset), h);
          const std::string at =
              what + " offset " + std::to_string(offset) + " step " + std::to_string(step);
          expect_same_bits(dp.download(p.size(), offset), p, at + " params");
          expect_same_bits(dm.download(m.size(), offset), m, at + " m");
          expect_same_bits(dv.download(v.size(), offset), v, at + " v");
        }
      }
    }
  }
}

// --- the back end's scalar math on the host (no device needed)
// ---------------------------------------

namespace cuda_math = dst::kernels::cuda_backend::detail::math;

/// Every 1021st bit pattern of all 2^32 (4.2 million: every binade densely), both signs,
/// plus the clamp boundaries.
template <class F>
void for_sampled_floats(F&& f) {
  for (std::uint64_t u = 0; u <= 0xffffffffULL; u += 1021)
    f(float_of(static_cast<std::uint32_t>(u)));
  for (const float x : {0.0f, -0.0f, -87.33654f, 88.72283f, std::nextafter(-87.33654f, -100.0f),
                        std::nextafter(88.72283f, 100.0f), 1.0f, -1.0f})
    f(x);
}

// fast_exp, sigmoid and nonfinite_bits are not ported: both back ends include the one
// definition in kernels/detail/fast_math.hpp (its accuracy: kernels_tests FastExp).

TEST(CudaHostMath, RoundingIsCoreBitForBit) {
  std::size_t bad = 0;
  const auto check = [&](float x) {
    const bool same = bits_of(cuda_math::round_to_bf16(x)) == bits_of(round_to_bf16(x)) &&
                      bits_of(cuda_math::round_to_f16(x)) == bits_of(round_to_f16(x));
    if (!same && ++bad <= 5) ADD_FAILURE() << "x bits 0x" << std::hex << bits_of(x);
  };
  for (const float x : rounding_samples())
    check(x);
  for_sampled_floats(check);
  EXPECT_EQ(bad, 0u);
}

TEST(CudaHostMath, NonfiniteBitsAreKokkosTest) {
  for (const std::uint32_t u :
       {0x7f800000u, 0xff800000u, 0x7f800001u, 0x7fffffffu, 0x7f7fffffu, 0x00000001u, 0x80000000u})
    EXPECT_EQ(cuda_math::nonfinite_bits(float_of(u)), (u & 0x7f800000u) == 0x7f800000u) << u;
}

}  // namespace
}  // namespace dst::kernels::test
