// Kokkos back-end kernels at the model presets' shapes (N = B*T = 2048 tokens):
//   preset 0 "tiny":  C = 256, F = 688,  V = 260,  H = 4, T = 256
//   preset 1 "small": C = 512, F = 1376, V = 4096, H = 8, T = 512
// and the passes over the whole gradient buffer of one optimizer step (the non-finite
// scan, the sum of squares for the norm, AdamW) at the presets' parameter counts:
// tiny 3,297,536, small 29,499,904 floats.
//
//   kernels_benchmark [--benchmark_filter=rmsnorm]
//
// bytes_per_second counts the bytes each kernel must move at least (every input read
// once, every output written once), so it compares directly with the memory bandwidth;
// items_per_second counts rows (tokens, or attention rows for the softmax).
#include <benchmark/benchmark.h>

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/kernels.hpp"

namespace {

using dst::DType;
using dst::tensor::Device;
using dst::tensor::ExecContext;
using dst::tensor::Shape;
using dst::tensor::Tensor;

struct Preset {
  const char* name;
  std::int64_t c, f, v, h, t;
};
constexpr Preset kPresets[] = {{"tiny", 256, 688, 260, 4, 256}, {"small", 512, 1376, 4096, 8, 512}};
constexpr std::int64_t kTokens = 2048;  // N = B*T

const Preset& preset(const benchmark::State& state) {
  return kPresets[state.range(0)];
}

/// A host buffer of uniform values in [lo, hi) and its Tensor.
struct Buffer {
  std::vector<float> data;
  Tensor tensor;
  Buffer(Shape s, float lo = -1.0f, float hi = 1.0f, std::uint32_t seed = 1)
      : data(static_cast<std::size_t>(s.numel())) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> dist(lo, hi);
    for (auto& x : data)
      x = dist(gen);
    tensor = Tensor{data.data(), s, DType::f32, Device::host};
  }
};

struct Ids {
  std::vector<std::int32_t> data;
  Tensor tensor;
  Ids(std::int64_t n, std::int64_t v) : data(static_cast<std::size_t>(n)) {
    std::mt19937 gen(7);
    std::uniform_int_distribution<std::int32_t> dist(0, static_cast<std::int32_t>(v - 1));
    for (auto& x : data)
      x = dist(gen);
    tensor = Tensor{data.data(), Shape{n}, DType::i32, Device::host};
  }
};

const ExecContext kCtx{};

void finish(benchmark::State& state, double bytes_per_iter, double items_per_iter) {
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes_per_iter * state.iterations()));
  state.SetItemsProcessed(static_cast<std::int64_t>(items_per_iter * state.iterations()));
  state.SetLabel(preset(state).name);
}

void BM_embedding_forward(benchmark::State& state) {
  const auto& p = preset(state);
  Ids tok(kTokens, p.v);
  Buffer wte({p.v, p.c}), out({kTokens, p.c});
  for (auto _ : state)
    dst::kernels::embedding_forward(kCtx, tok.tensor, wte.tensor, out.tensor);
  finish(state, 2.0 * 4 * kTokens * p.c, kTokens);
}

void BM_embedding_backward(benchmark::State& state) {
  const auto& p = preset(state);
  Ids tok(kTokens, p.v);
  Buffer dout({kTokens, p.c}), dwte({p.v, p.c});
  for (auto _ : state)
    dst::kernels::embedding_backward(kCtx, tok.tensor, dout.tensor, dwte.tensor);
  finish(state, 3.0 * 4 * kTokens * p.c, kTokens);
}

void BM_rmsnorm_forward(benchmark::State& state) {
  const auto& p = preset(state);
  Buffer x({kTokens, p.c}), w({p.c}), out({kTokens, p.c}), rstd({kTokens});
  for (auto _ : state)
    dst::kernels::rmsnorm_forward(kCtx, x.tensor, w.tensor, 1e-6f, out.tensor, rstd.tensor);
  finish(state, 2.0 * 4 * kTokens * p.c, kTokens);
}

void BM_rmsnorm_backward(benchmark::State& state) {
  const auto& p = preset(state);
  Buffer x({kTokens, p.c}), w({p.c}), dout({kTokens, p.c}), rstd({kTokens}, 0.5f, 2.0f);
  Buffer dx({kTokens, p.c}), dw({p.c});
  for (auto _ : state)
    dst::kernels::rmsnorm_backward(kCtx, dout.tensor, x.tensor, w.tensor, rstd.tensor, dx.tensor,
                                   dw.tensor);
  finish(state, 4.0 * 4 * kTokens * p.c, kTokens);  // dout, x, dx read; dx written
}

void rope(benchmark::State& state, bool backward) {
  const auto& p = preset(state);
  const std::int64_t d = p.c / p.h;
  Buffer x({kTokens / p.t, p.t, p.h, d}), cs({p.t, d / 2}), sn({p.t, d / 2});
  dst::kernels::rope_tables(kCtx, 10000.0, cs.tensor, sn.tensor);
  for (auto _ : state) {
    if (backward)
      dst::kernels::rope_backward(kCtx, x.tensor, cs.tensor, sn.tensor);
    else
      dst::kernels::rope_forward(kCtx, x.tensor, cs.tensor, sn.tensor);
  }
  finish(state, 2.0 * 4 * kTokens * p.c, kTokens);
}
void BM_rope_forward(benchmark::State& state) {
  rope(state, false);
}
void BM_rope_backward(benchmark::State& state) {
  rope(state, true);
}

void BM_causal_softmax_forward(benchmark::State& state) {
  const auto& p = preset(state);
  const Shape s{kTokens / p.t, p.h, p.t, p.t};
  Buffer scores(s, -4.0f, 4.0f), probs(s);
  for (auto _ : state)
    dst::kernels::causal_softmax_forward(kCtx, scores.tensor, 0.125f, probs.tensor);
  // The live lower triangle is read; every entry is written.
  const double n = static_cast<double>(s.numel());
  finish(state, 4.0 * (n / 2 + n), static_cast<double>(s.numel() / p.t));
}

void BM_causal_softmax_backward(benchmark::State& state) {
  const auto& p = preset(state);
  const Shape s{kTokens / p.t, p.h, p.t, p.t};
  Buffer probs(s, 0.0f, 0.01f), dprobs(s), dscores(s);
  for (auto _ : state)
    dst::kernels::causal_softmax_backward(kCtx, probs.tensor, dprobs.tensor, 0.125f,
                                          dscores.tensor);
  const double n = static_cast<double>(s.numel());
  finish(state, 4.0 * (n + n), static_cast<double>(s.numel() / p.t));
}

void BM_swiglu_forward(benchmark::State& state) {
  const auto& p = preset(state);
  Buffer h1({kTokens, p.f}, -4.0f, 4.0f), h3({kTokens, p.f}), out({kTokens, p.f});
  for (auto _ : state)
    dst::kernels::swiglu_forward(kCtx, h1.tensor, h3.tensor, out.tensor);
  finish(state, 3.0 * 4 * kTokens * p.f, kTokens);
}

void BM_swiglu_backward(benchmark::State& state) {
  const auto& p = preset(state);
  Buffer dout({kTokens, p.f}), h1({kTokens, p.f}, -4.0f, 4.0f), h3({kTokens, p.f});
  Buffer dh1({kTokens, p.f}), dh3({kTokens, p.f});
  for (auto _ : state)
    dst::kernels::swiglu_backward(kCtx, dout.tensor, h1.tensor, h3.tensor, dh1.tensor, dh3.tensor);
  finish(state, 5.0 * 4 * kTokens * p.f, kTokens);
}

void BM_cross_entropy_forward(benchmark::State& state) {
  const auto& p = preset(state);
  Ids tg(kTokens, p.v);
  Buffer logits({kTokens, p.v}, -5.0f, 5.0f), losses({kTokens});
  for (auto _ : state)
    dst::kernels::cross_entropy_forward(kCtx, logits.tensor, tg.tensor, -100, losses.tensor);
  finish(state, 4.0 * kTokens * p.v, kTokens);
}

void BM_cross_entropy_fused(benchmark::State& state) {
  const auto& p = preset(state);
  Ids tg(kTokens, p.v);
  Buffer logits({kTokens, p.v}, -5.0f, 5.0f), losses({kTokens}), dlogits({kTokens, p.v});
  for (auto _ : state)
    dst::kernels::cross_entropy_fused(kCtx, logits.tensor, tg.tensor, -100, 1.0f / kTokens,
                                      losses.tensor, dlogits.tensor);
  finish(state, 2.0 * 4 * kTokens * p.v, kTokens);
}

void BM_add(benchmark::State& state) {
  const auto& p = preset(state);
  Buffer a({kTokens, p.c}), b({kTokens, p.c}), out({kTokens, p.c});
  for (auto _ : state)
    dst::kernels::add(kCtx, a.tensor, b.tensor, out.tensor);
  finish(state, 3.0 * 4 * kTokens * p.c, kTokens);
}

void BM_accumulate(benchmark::State& state) {
  const auto& p = preset(state);
  Buffer x({kTokens, p.c}), y({kTokens, p.c});
  for (auto _ : state)
    dst::kernels::accumulate(kCtx, x.tensor, y.tensor);
  finish(state, 3.0 * 4 * kTokens * p.c, kTokens);
}

void BM_zero(benchmark::State& state) {
  const auto& p = preset(state);
  Buffer t({kTokens, p.f});
  for (auto _ : state)
    dst::kernels::zero(kCtx, t.tensor);
  finish(state, 4.0 * kTokens * p.f, kTokens);
}

// --- passes over the flat gradient buffer, once per optimizer step ----------------------
// (the parameter counts of model::preset("tiny") and ("small"), as dstrain train prints)
constexpr std::int64_t kParams[] = {3'297'536, 29'499'904};

void BM_first_nonfinite(benchmark::State& state) {
  const std::int64_t n = kParams[state.range(0)];
  Buffer g({n}, -1e-3f, 1e-3f);  // all finite: the whole buffer is read (the common case)
  for (auto _ : state)
    benchmark::DoNotOptimize(dst::kernels::first_nonfinite(kCtx, g.tensor));
  finish(state, 4.0 * n, static_cast<double>(n));
}

void BM_sum_of_squares(benchmark::State& state) {
  const std::int64_t n = kParams[state.range(0)];
  Buffer g({n}, -1e-3f, 1e-3f);
  for (auto _ : state)
    benchmark::DoNotOptimize(dst::kernels::sum_of_squares(kCtx, g.tensor));
  finish(state, 4.0 * n, static_cast<double>(n));
}

void BM_adamw_step(benchmark::State& state) {
  const std::int64_t n = kParams[state.range(0)];
  Buffer p({n}, -0.05f, 0.05f, 1), g({n}, -1e-3f, 1e-3f, 2), m({n}, 0.0f, 0.0f, 3),
      v({n}, 0.0f, 0.0f, 4);
  dst::kernels::AdamWHyper h;
  h.lr = 1e-3;
  h.weight_decay = 0.1;
  for (auto _ : state) {
    dst::kernels::adamw_step(kCtx, p.tensor, g.tensor, m.tensor, v.tensor, h);
    ++h.step;
  }
  finish(state, 4.0 * 7 * n, static_cast<double>(n));  // p, g, m, v read; p, m, v written
}

#define DST_KERNEL_BENCHMARK(fn) BENCHMARK(fn)->ArgName("preset")->Arg(0)->Arg(1)
DST_KERNEL_BENCHMARK(BM_embedding_forward);
DST_KERNEL_BENCHMARK(BM_embedding_backward);
DST_KERNEL_BENCHMARK(BM_rmsnorm_forward);
DST_KERNEL_BENCHMARK(BM_rmsnorm_backward);
DST_KERNEL_BENCHMARK(BM_rope_forward);
DST_KERNEL_BENCHMARK(BM_rope_backward);
DST_KERNEL_BENCHMARK(BM_causal_softmax_forward);
DST_KERNEL_BENCHMARK(BM_causal_softmax_backward);
DST_KERNEL_BENCHMARK(BM_swiglu_forward);
DST_KERNEL_BENCHMARK(BM_swiglu_backward);
DST_KERNEL_BENCHMARK(BM_cross_entropy_forward);
DST_KERNEL_BENCHMARK(BM_cross_entropy_fused);
DST_KERNEL_BENCHMARK(BM_add);
DST_KERNEL_BENCHMARK(BM_accumulate);
DST_KERNEL_BENCHMARK(BM_zero);
DST_KERNEL_BENCHMARK(BM_first_nonfinite);
DST_KERNEL_BENCHMARK(BM_sum_of_squares);
DST_KERNEL_BENCHMARK(BM_adamw_step);

}  // namespace

int main(int argc, char** argv) {
  // Kokkos for the whole run (the kernels refuse to run without it).
  Kokkos::ScopeGuard kokkos(argc, argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
