// One forward + backward of the model on the `tiny`, `small` and `tiny-moe` presets, single
// threaded, reporting tokens/s and model GFLOP/s (the project's FLOPs definition,
// model/plan.hpp), next to the single-thread SGEMM rate at 2048^3 that defines the CPU
// peak for MFU. benchmarks/model/mfu.sh runs it and prints MFU = model / peak.
// BM_forward_backward_paired runs the same pass with the host's products as
// kernels.host_gemm blas and auto (dstrain's own kernels for most) place them, one right
// after the other.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <Kokkos_Core.hpp>
#include <string>
#include <vector>

#include "blas/gemm.hpp"
#include "blas/host_blas.hpp"
#include "blas/own_gemm.hpp"
#include "common/paired.hpp"
#include "config/deck.hpp"
#include "core/rng.hpp"
#include "model/language_model.hpp"
#include "model/plan.hpp"

namespace {

dst::config::ModelSection preset(const std::string& name) {
  return dst::config::load_deck_text("model: {preset: " + name + "}\n", "benchmark").model;
}

/// A model's options on the back end `ctx`.
dst::model::ModelOptions on(dst::tensor::ExecContext ctx) {
  dst::model::ModelOptions o;
  o.ctx = ctx;
  return o;
}

// One model of a preset with its micro-batch of pseudo-random tokens.
struct Pass {
  Pass(const std::string& name, std::int64_t batch, dst::tensor::ExecContext ctx = {})
      : m(preset(name)),
        T(m.max_seq_len),
        model(m, batch, T, dst::tensor::Arena::Mode::allocate, on(ctx)),
        tokens(static_cast<std::size_t>(batch * T)),
        targets(tokens.size()) {
    model.params().initialize(1234);
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = static_cast<std::int32_t>(dst::core::uniform01(1, 1, i) *
                                            static_cast<float>(m.vocab_size));
      targets[i] = static_cast<std::int32_t>(dst::core::uniform01(1, 2, i) *
                                             static_cast<float>(m.vocab_size));
    }
  }
  void run() {
    model.params().zero_grads();
    benchmark::DoNotOptimize(
        model.forward_backward(tokens.data(), targets.data(), 1.0f / tokens.size()).loss_sum);
  }
  void count(benchmark::State& state) const {
    const double tok = static_cast<double>(tokens.size());
    const double flops = dst::model::training_flops_per_token(m, T) * tok;
    state.counters["tokens_per_s"] =
        benchmark::Counter(tok, benchmark::Counter::kIsIterationInvariantRate);
    state.counters["GFLOPs"] =
        benchmark::Counter(flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  }

  dst::config::ModelSection m;
  std::int64_t T;
  dst::model::LanguageModel model;
  std::vector<std::int32_t> tokens, targets;
};

void forward_backward(benchmark::State& state, const std::string& name, std::int64_t batch) {
  Pass pass(name, batch);
  for (auto _ : state)
    pass.run();
  pass.count(state);
}

void BM_forward_backward_tiny(benchmark::State& s) {
  forward_backward(s, "tiny", s.range(0));
}
void BM_forward_backward_small(benchmark::State& s) {
  forward_backward(s, "small", s.range(0));
}
// DeepSeek-V2/V3 layers: latent attention and DeepSeekMoE at tiny's width and
// active FLOPs (model FLOPs count the active parameters, docs/performance.md).
void BM_forward_backward_tiny_moe(benchmark::State& s) {
  forward_backward(s, "tiny-moe", s.range(0));
}

// The routed experts' grouped products at tiny-moe's shapes (d_model 256, width 224, 8
// experts, top-2) for a micro-batch of s.range(0) sequences of 256 tokens, the rows spread
// evenly over the experts: each expert's gate, up (rows x 256 -> 224) and down (224 ->
// 256) products, forward only, as Moe::forward runs them. GFLOPs against BM_sgemm_peak's
// rate is the grouped products' efficiency.
void BM_moe_expert_products(benchmark::State& state) {
  const dst::config::ModelSection m = preset("tiny-moe");
  const std::int64_t C = m.d_model, I = m.moe_intermediate_size, E = m.n_routed_experts;
  const std::int64_t R = state.range(0) * m.max_seq_len * m.num_experts_per_tok;
  const std::int64_t rows = R / E;
  using dst::tensor::Tensor;
  std::vector<float> xs(static_cast<std::size_t>(R * C), 0.01f), h(static_cast<std::size_t>(R * I)),
      y(static_cast<std::size_t>(R * C)), w(static_cast<std::size_t>(E * 3 * I * C), 0.02f);
  const dst::tensor::ExecContext ctx{};
  for (auto _ : state) {
    for (std::int64_t e = 0; e < E; ++e) {
      const Tensor x{xs.data() + e * rows * C, {rows, C}};
      const Tensor hh{h.data() + e * rows * I, {rows, I}};
      float* we = w.data() + e * 3 * I * C;
      dst::blas::linear_forward(ctx, x, Tensor{we, {I, C}}, hh);
      dst::blas::linear_forward(ctx, x, Tensor{we + I * C, {I, C}}, hh);
      dst::blas::linear_forward(ctx, hh, Tensor{we + 2 * I * C, {C, I}},
                                Tensor{y.data() + e * rows * C, {rows, C}});
    }
    benchmark::DoNotOptimize(y.data());
  }
  const double flops = 3.0 * 2.0 * static_cast<double>(rows * E) * static_cast<double>(C * I);
  state.counters["GFLOPs"] =
      benchmark::Counter(flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

// The same forward + backward with the host's products as kernels.host_gemm `blas` places
// them (all in OpenBLAS) and as `auto` does (attention's and the dense layers' forward and
// dx products in dstrain's own kernels, the weight gradients in OpenBLAS): two models, the
// same parameters and tokens, one right after the other in every iteration, the order
// alternating, so that the host's drift (10-30% between minutes on a shared VM) moves both
// alike. The time and rates reported are auto's pass; the counter blas_over_auto is the
// median over iterations of the blas pass's time divided by auto's (above 1: auto is
// faster).
void BM_forward_backward_paired(benchmark::State& state) {
  if (!dst::blas::own_gemm_supported()) {
    state.SkipWithError("this CPU has no AVX-512F: auto runs every product in the BLAS");
    return;
  }
  const std::string name = state.range(0) == 0 ? "tiny" : "small";
  dst::tensor::ExecContext blas_ctx, auto_ctx;
  blas_ctx.host_gemm = dst::tensor::HostGemm::blas;
  auto_ctx.host_gemm = dst::tensor::HostGemm::automatic;
  Pass blas(name, state.range(1), blas_ctx), automatic(name, state.range(1), auto_ctx);
  const dst::bench::PairedTimes t = dst::bench::run_paired(
      state, [&] { blas.run(); }, [&] { automatic.run(); });
  automatic.count(state);
  state.counters["blas_over_auto"] = t.median_ratio();
  state.SetLabel(name + ": " + dst::blas::describe_host_products(auto_ctx));
}

// The CPU peak definition: single-thread SGEMM, 2048^3.
void BM_sgemm_peak(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  std::vector<float> a(static_cast<std::size_t>(n * n), 0.5f), b(a.size(), 0.25f), c(a.size());
  const dst::tensor::ExecContext ctx;
  for (auto _ : state) {
    dst::blas::gemm(ctx, dst::blas::Trans::no, dst::blas::Trans::no, n, n, n, 1.0f, a.data(), n,
                    b.data(), n, 0.0f, c.data(), n);
    benchmark::ClobberMemory();
  }
  state.counters["GFLOPs"] =
      benchmark::Counter(2.0 * n * n * n / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

BENCHMARK(BM_sgemm_peak)->Arg(2048)->Arg(256)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_forward_backward_tiny)->Arg(8)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_forward_backward_small)->Arg(4)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_forward_backward_tiny_moe)
    ->Arg(8)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_moe_expert_products)->Arg(8)->Unit(benchmark::kMillisecond)->UseRealTime();
// Args: preset (0 tiny, 1 small), micro-batch.
BENCHMARK(BM_forward_backward_paired)
    ->ArgNames({"small", "batch"})
    ->Args({0, 1})  // the CTest smoke run
    ->Args({0, 8})
    ->Args({1, 4})
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();

int main(int argc, char** argv) {
  dst::blas::select_host_kernels(argv);  // the kernels dstrain runs with (host_blas.hpp)
  openblas_set_num_threads(1);           // MFU is per core: one thread for the model and the peak
  Kokkos::ScopeGuard kokkos(argc, argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
