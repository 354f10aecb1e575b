// One forward + backward of the dense model on the `tiny` and `small` presets, single
// threaded, reporting tokens/s and model GFLOP/s (the project's FLOPs definition,
// model/plan.hpp), next to the single-thread SGEMM rate at 2048^3 that defines the CPU
// peak for MFU. benchmarks/model/mfu.sh runs it and prints MFU = model / peak.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <Kokkos_Core.hpp>
#include <vector>

#include "blas/gemm.hpp"
#include "blas/host_blas.hpp"
#include "config/deck.hpp"
#include "core/rng.hpp"
#include "model/dense_model.hpp"
#include "model/plan.hpp"

namespace {

dst::config::ModelSection preset(const std::string& name) {
  return dst::config::load_deck_text("model: {preset: " + name + "}\n", "benchmark").model;
}

void forward_backward(benchmark::State& state, const std::string& name, std::int64_t batch) {
  const auto m = preset(name);
  const std::int64_t T = m.max_seq_len;
  dst::model::DenseModel model(m, batch, T, dst::tensor::Arena::Mode::allocate);
  model.params().initialize(1234);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(batch * T));
  std::vector<std::int32_t> targets(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] =
        static_cast<std::int32_t>(dst::core::uniform01(1, 1, i) * static_cast<float>(m.vocab_size));
    targets[i] =
        static_cast<std::int32_t>(dst::core::uniform01(1, 2, i) * static_cast<float>(m.vocab_size));
  }
  const float scale = 1.0f / static_cast<float>(tokens.size());
  for (auto _ : state) {
    model.params().zero_grads();
    benchmark::DoNotOptimize(model.forward_backward(tokens.data(), targets.data(), scale));
  }
  const double tok = static_cast<double>(tokens.size());
  const double flops = dst::model::training_flops_per_token(m, T) * tok;
  state.counters["tokens_per_s"] =
      benchmark::Counter(tok, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOPs"] =
      benchmark::Counter(flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_forward_backward_tiny(benchmark::State& s) {
  forward_backward(s, "tiny", s.range(0));
}
void BM_forward_backward_small(benchmark::State& s) {
  forward_backward(s, "small", s.range(0));
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
