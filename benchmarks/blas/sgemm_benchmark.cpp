// Single-thread SGEMM through dst::blas::gemm (host back end, OpenBLAS).
//
// The median GFLOPS of BM_sgemm/M:2048/N:2048/K:2048 is the project's CPU peak for MFU.
// It is measured on one core so that it is a per-core figure, independent of how many
// cores a run gives each rank (a run's peak is this times the cores it computes on).
// The model-shaped cases (tiny preset: d_model 256, ffn 688,
// qkv 3 * 256, vocab 260, 2048 tokens per micro-batch) show how far the layers' products
// fall below that peak; BM_sgemm_from_memory runs tiny's and small's layer products with
// their operands coming from memory, as inside a training step, and again from cache;
// BM_layer_product_paired runs the same products from memory through OpenBLAS and through
// dstrain's own kernel (blocked_gemm), alternately.
// BM_attention_head and BM_attention_head_paired compare OpenBLAS and dstrain's own kernel
// on the products of one attention head.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "blas/gemm.hpp"
#include "blas/host_blas.hpp"
#include "blas/own_gemm.hpp"
#include "common/evict.hpp"
#include "common/paired.hpp"
#include "common/tiny_layers.hpp"

namespace {

using dst::blas::Trans;

// One product's operands from the benchmark's first five args: M, N, K, transpose A,
// transpose B (0/1), as in gemm.hpp's row-major convention.
struct Product {
  explicit Product(const benchmark::State& state)
      : m(state.range(0)),
        n(state.range(1)),
        k(state.range(2)),
        ta(state.range(3) != 0 ? Trans::yes : Trans::no),
        tb(state.range(4) != 0 ? Trans::yes : Trans::no),
        a(static_cast<std::size_t>(m * k)),
        b(static_cast<std::size_t>(k * n)),
        c(static_cast<std::size_t>(m * n), 0.0F) {
    // Values in [0.5, 1.5): no denormals, no growth towards overflow.
    for (std::size_t i = 0; i < a.size(); ++i)
      a[i] = 0.5F + static_cast<float>(i % 97) / 97.0F;
    for (std::size_t i = 0; i < b.size(); ++i)
      b[i] = 0.5F + static_cast<float>(i % 89) / 89.0F;
  }
  // Row strides of the stored operands (packed: no padding between rows).
  std::int64_t lda() const { return ta == Trans::no ? k : m; }
  std::int64_t ldb() const { return tb == Trans::no ? n : k; }
  void run(float beta) {
    dst::blas::gemm(host, ta, tb, m, n, k, 1.0F, a.data(), lda(), b.data(), ldb(), beta, c.data(),
                    n);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  // The same product in dstrain's own kernel (beta 0 or 1: written or accumulated).
  void run_own(float beta) {
    dst::blas::blocked_gemm(ta, tb, m, n, k, a.data(), lda(), b.data(), ldb(), beta != 0.0F,
                            c.data(), n);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  // 2 M N K flops per product (one multiply and one add per term).
  double flops() const { return 2.0 * static_cast<double>(m * n * k); }

  std::int64_t m, n, k;
  Trans ta, tb;
  std::vector<float> a, b, c;
  dst::tensor::ExecContext host{};
};

void BM_sgemm(benchmark::State& state) {
  Product p(state);
  for (auto _ : state)
    p.run(0.0F);
  state.counters["GFLOPS"] =
      benchmark::Counter(1e-9 * p.flops(), benchmark::Counter::kIsIterationInvariantRate);
}

constexpr std::int64_t kTokens = dst::bench::kTinyTokens;

void peak_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "N", "K", "tA", "tB"});
  b->Args({2048, 2048, 2048, 0, 0});  // the peak definition
  b->Args({64, 64, 64, 0, 0});        // tiny: the CTest smoke run
}

void model_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "N", "K", "tA", "tB"});
  for (const dst::bench::DenseLayer& l : dst::bench::kTinyDenseLayers) {
    b->Args({kTokens, l.out, l.in, 0, 1});  // forward  y (N, out) = x (N, in) W^T
    b->Args({kTokens, l.in, l.out, 0, 0});  // backward dx (N, in) = dy (N, out) W
    b->Args({l.out, l.in, kTokens, 1, 0});  // backward dW (out, in) += dy^T x
  }
}

using dst::bench::evict_caches;
using dst::bench::median_of;

// A product whose operands come from memory, as a training step's do (each activation and
// weight was last touched a layer or a step earlier), against the same product at once
// again with them in cache, as a loop of BM_sgemm runs it. Every iteration evicts the
// caches (untimed), times the product (the iteration's time: from memory), then times it
// again (in cache). Counters: the median of each and their ratio, per iteration.
// Args: M, N, K, tA, tB as BM_sgemm, and beta (0: C written, as the forward's products;
// 1: accumulated, as the weight gradients').
void BM_sgemm_from_memory(benchmark::State& state) {
  Product p(state);
  const float beta = state.range(5) != 0 ? 1.0F : 0.0F;
  using Clock = std::chrono::steady_clock;
  auto product = [&] {
    const auto t0 = Clock::now();
    p.run(beta);
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  std::vector<double> cold, warm, ratio;
  for (auto _ : state) {
    evict_caches();
    cold.push_back(product());
    warm.push_back(product());
    state.SetIterationTime(cold.back());
    ratio.push_back(cold.back() / warm.back());
  }
  const double flop = p.flops();
  const double cold_s = median_of(cold), warm_s = median_of(warm);
  state.counters["GFLOPS_from_memory"] = cold_s > 0 ? 1e-9 * flop / cold_s : 0.0;
  state.counters["GFLOPS_in_cache"] = warm_s > 0 ? 1e-9 * flop / warm_s : 0.0;
  state.counters["from_memory_over_in_cache"] = median_of(ratio);
}

// A layer product from memory (caches evicted before each) through OpenBLAS and through
// dstrain's kernel, one right after the other in every iteration, the order alternating, so
// that the host's drift moves both alike. The iteration's time is the own kernel's;
// counters: each path's median GFLOP/s and blas_over_own, the median over iterations of
// OpenBLAS's time over the own kernel's (above 1: the own kernel is faster).
// Args as BM_sgemm_from_memory.
void BM_layer_product_paired(benchmark::State& state) {
  if (!dst::blas::own_gemm_supported()) {
    state.SkipWithError("this CPU has no AVX-512F: there is no own kernel to compare");
    return;
  }
  Product p(state);
  const float beta = state.range(5) != 0 ? 1.0F : 0.0F;
  const dst::bench::PairedTimes t = dst::bench::run_paired(
      state, [&] { p.run(beta); }, [&] { p.run_own(beta); }, evict_caches);
  const double flop = p.flops();
  state.counters["GFLOPS_blas"] = 1e-9 * flop / median_of(t.baseline);
  state.counters["GFLOPS_own"] = 1e-9 * flop / median_of(t.candidate);
  state.counters["blas_over_own"] = t.median_ratio();
}

// The layer products of tiny (2048 tokens per micro-batch) and small (512), with the
// model's beta: forward and dx written, dW accumulated.
void from_memory_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "N", "K", "tA", "tB", "beta"});
  b->Args({64, 64, 64, 0, 1, 0});  // tiny: the CTest smoke run
  struct Layer {
    std::int64_t out, in;
  };
  const Layer tiny[] = {{256, 256}, {688, 256}, {256, 688}};
  const Layer small[] = {{512, 512}, {1376, 512}, {512, 1376}, {4096, 512}};
  auto add = [&](std::int64_t tokens, const Layer& l) {
    b->Args({tokens, l.out, l.in, 0, 1, 0});  // forward  y (N, out) = x (N, in) W^T
    b->Args({tokens, l.in, l.out, 0, 0, 0});  // backward dx (N, in) = dy (N, out) W
    b->Args({l.out, l.in, tokens, 1, 0, 1});  // backward dW (out, in) += dy^T x
  };
  for (const Layer& l : tiny)
    add(kTokens, l);
  for (const Layer& l : small)
    add(512, l);
}

// One head of causal attention as the model runs it on a host core (model/layers/attention.cpp):
// the six products of its 64-row query blocks (scores, P x V; d_probs, d_v; d_q, d_k), head_dim 64,
// rows of q, k, v H x 64 floats apart (tiny: T 256, H 4; small: T 512, H 8). Each pass runs them
// through OpenBLAS (gemm_strided_batched) or dstrain's kernel (small_gemm_strided_batched; on a CPU
// without AVX-512F the same OpenBLAS calls).
class AttentionHead {
 public:
  AttentionHead(std::int64_t t, std::int64_t heads)
      : T(t),
        HD(heads * D),
        q(values(rows(), 97)),
        k(values(rows(), 89)),
        v(values(rows(), 83)),
        da(values(rows(), 79)),
        p(values(square(), 73)),
        dp(values(square(), 71)),
        out(rows()),
        dq(rows()),
        dk(rows()),
        dv(rows()) {}

  double flops() const {
    double f = 0;
    for (std::int64_t r0 = 0; r0 < T; r0 += kBlock)
      f += 6.0 * 2.0 * static_cast<double>(std::min(kBlock, T - r0) * std::min(T, r0 + kBlock) * D);
    return f;
  }

  void pass(bool own) {
    std::fill(dk.begin(), dk.end(), 0.0F);  // accumulated over blocks, as in the model
    std::fill(dv.begin(), dv.end(), 0.0F);
    auto product = [&](Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t kk,
                       const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                       bool accumulate, float* c, std::int64_t ldc) {
      if (own)
        dst::blas::small_gemm_strided_batched(host, ta, tb, m, n, kk, a, lda, 0, b, ldb, 0,
                                              accumulate, c, ldc, 0, 1);
      else
        dst::blas::gemm_strided_batched(host, ta, tb, m, n, kk, 1.0F, a, lda, 0, b, ldb, 0,
                                        accumulate ? 1.0F : 0.0F, c, ldc, 0, 1);
    };
    blocks([&](std::int64_t r0, std::int64_t r1) {
      product(Trans::no, Trans::yes, r1 - r0, r1, D, q.data() + r0 * HD, HD, k.data(), HD, false,
              p.data() + r0 * T, T);
    });
    blocks([&](std::int64_t r0, std::int64_t r1) {
      product(Trans::no, Trans::no, r1 - r0, D, r1, p.data() + r0 * T, T, v.data(), HD, false,
              out.data() + r0 * HD, HD);
    });
    blocks([&](std::int64_t r0, std::int64_t r1) {
      product(Trans::no, Trans::yes, r1 - r0, r1, D, da.data() + r0 * HD, HD, v.data(), HD, false,
              dp.data() + r0 * T, T);
      product(Trans::yes, Trans::no, r1, D, r1 - r0, p.data() + r0 * T, T, da.data() + r0 * HD, HD,
              true, dv.data(), HD);
    });
    blocks([&](std::int64_t r0, std::int64_t r1) {
      product(Trans::no, Trans::no, r1 - r0, D, r1, dp.data() + r0 * T, T, k.data(), HD, false,
              dq.data() + r0 * HD, HD);
      product(Trans::yes, Trans::no, r1, D, r1 - r0, dp.data() + r0 * T, T, q.data() + r0 * HD, HD,
              true, dk.data(), HD);
    });
    benchmark::DoNotOptimize(dk.data());
    benchmark::ClobberMemory();
  }

 private:
  static constexpr std::int64_t D = 64, kBlock = 64;
  std::int64_t T, HD;
  std::vector<float> q, k, v, da, p, dp, out, dq, dk, dv;
  dst::tensor::ExecContext host{};

  std::size_t rows() const { return static_cast<std::size_t>(T * HD); }
  std::size_t square() const { return static_cast<std::size_t>(T * T); }
  static std::vector<float> values(std::size_t n, int mod) {
    std::vector<float> x(n);
    for (std::size_t i = 0; i < n; ++i)
      x[i] = 0.5F + static_cast<float>(i % static_cast<std::size_t>(mod)) / static_cast<float>(mod);
    return x;
  }
  template <class Body>
  void blocks(Body body) const {
    for (std::int64_t r0 = 0; r0 < T; r0 += kBlock)
      body(r0, std::min(T, r0 + kBlock));
  }
};

const char* own_label() {
  return dst::blas::own_gemm_supported() ? "dstrain kernel" : "OpenBLAS (no AVX-512F)";
}

// Args: T, H, and 0 (OpenBLAS) or 1 (dstrain's kernel).
void BM_attention_head(benchmark::State& state) {
  AttentionHead head(state.range(0), state.range(1));
  const bool own = state.range(2) != 0;
  for (auto _ : state)
    head.pass(own);
  state.counters["GFLOPS"] =
      benchmark::Counter(1e-9 * head.flops(), benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(own ? own_label() : "OpenBLAS");
}

// Both paths in every iteration, one right after the other (the order alternating), so
// that the host's drift, which on a shared VM moves a whole benchmark by 10-30%, moves both
// alike: the time reported is dstrain's kernel's, and the counter `openblas_over_own` is
// the median over iterations of OpenBLAS's pass time divided by the kernel's.
void BM_attention_head_paired(benchmark::State& state) {
  AttentionHead head(state.range(0), state.range(1));
  const dst::bench::PairedTimes t = dst::bench::run_paired(
      state, [&] { head.pass(false); }, [&] { head.pass(true); });
  state.counters["openblas_over_own"] = t.median_ratio();
  state.counters["GFLOPS"] =
      benchmark::Counter(1e-9 * head.flops(), benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(own_label());
}

// Real time: OpenBLAS computes in its own threads when it has any, and their CPU time
// would not be counted against the benchmark thread.
BENCHMARK(BM_sgemm)
    ->Apply(peak_args)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);
BENCHMARK(BM_attention_head)
    ->ArgNames({"T", "H", "own"})
    ->Args({256, 4, 0})
    ->Args({256, 4, 1})
    ->Args({512, 8, 0})
    ->Args({512, 8, 1})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime()
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);
BENCHMARK(BM_attention_head_paired)
    ->ArgNames({"T", "H"})
    ->Args({256, 4})
    ->Args({512, 8})
    ->Unit(benchmark::kMicrosecond)
    ->UseManualTime()
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);
BENCHMARK(BM_sgemm_from_memory)
    ->Apply(from_memory_args)
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime()
    ->Iterations(15)
    ->Repetitions(3)
    ->ReportAggregatesOnly(true);
BENCHMARK(BM_layer_product_paired)
    ->Apply(from_memory_args)
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime()
    ->Iterations(16)
    ->Repetitions(3)
    ->ReportAggregatesOnly(true);
BENCHMARK(BM_sgemm)
    ->Name("BM_sgemm_model")
    ->Apply(model_args)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Repetitions(3)
    ->ReportAggregatesOnly(true);

}  // namespace

int main(int argc, char** argv) {
  // The kernels dstrain itself runs with (blas/host_blas.hpp): about 5x between OpenBLAS's
  // SSE3 and AVX-512 SGEMM, so the peak is only the run's peak with the same choice.
  dst::blas::select_host_kernels(argv);
  // One thread: the MFU peak is per core (see the file comment).
  openblas_set_num_threads(1);
  benchmark::AddCustomContext("openblas_threads",
                              std::to_string(openblas_get_num_threads()) +
                                  " (openblas_set_num_threads(1): single-thread SGEMM peak)");
  const dst::blas::HostBlas blas = dst::blas::host_blas();
  benchmark::AddCustomContext("openblas_config", blas.config);
  benchmark::AddCustomContext("openblas_core", blas.kernels);
  if (!blas.detected.empty()) benchmark::AddCustomContext("openblas_detected", blas.detected);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
