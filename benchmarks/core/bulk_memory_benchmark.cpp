// Streaming stores against memset / memcpy for the whole-buffer writes of a training step
// (core/bulk_memory.hpp): the gradient zeroing and the shared optimizer's gather, at the
// sizes of `tiny` (below core::kStreamingStoreBytes) and `small` (above it).
//
// Each iteration writes the same range both ways, one right after the other, the order
// alternating (common/paired.hpp). BM_zero_paired and BM_copy_half_paired evict the caches
// before each (as for small, whose buffers a step's forward and backward push out of
// cache); BM_zero_then_read_paired starts from a buffer in cache and times its next reader
// too (as for tiny, whose buffers stay in the last-level cache). The counter
// `ordinary_over_streaming` is the median over iterations of memset's (memcpy's) time over
// the streaming store's (above 1: streaming is faster).
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/evict.hpp"
#include "common/paired.hpp"
#include "core/bulk_memory.hpp"

namespace {

// Floats of tiny's and small's flat buffers: their parameter counts (`dstrain check`).
constexpr std::size_t kTinyFloats = 3'297'536;
constexpr std::size_t kSmallFloats = 29'499'904;
// The counters of a paired run; bytes written per call, if the write alone is timed.
void report(benchmark::State& state, const dst::bench::PairedTimes& t, std::size_t bytes) {
  state.counters["ordinary_over_streaming"] = t.median_ratio();
  state.counters["ordinary_ms"] = 1e3 * dst::bench::median_of(t.baseline);
  state.counters["streaming_ms"] = 1e3 * dst::bench::median_of(t.candidate);
  if (bytes > 0) state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
}

// arg 0: floats of the buffer. The whole buffer is zeroed, as ParamStore::zero_grads does.
void BM_zero_paired(benchmark::State& state) {
  const auto floats = static_cast<std::size_t>(state.range(0));
  std::vector<float> grads(floats, 1.0f);
  const auto t = dst::bench::run_paired(
      state, [&] { std::memset(grads.data(), 0, floats * sizeof(float)); },
      [&] { dst::core::stream_zero(grads.data(), floats * sizeof(float)); },
      dst::bench::evict_caches);
  report(state, t, floats * sizeof(float));
}

// arg 0: floats of the buffer. Half of it is copied into another buffer, as one of two
// ranks' gather (SharedSum::copy_my_part) does into its peer's parameters.
void BM_copy_half_paired(benchmark::State& state) {
  const auto floats = static_cast<std::size_t>(state.range(0));
  const std::size_t half = floats / 2;
  std::vector<float> mine(half, 2.0f), peers(half, 1.0f);
  const auto t = dst::bench::run_paired(
      state, [&] { std::memcpy(peers.data(), mine.data(), half * sizeof(float)); },
      [&] { dst::core::stream_copy(peers.data(), mine.data(), half * sizeof(float)); },
      dst::bench::evict_caches);
  report(state, t, half * sizeof(float));
}

// arg 0: floats of the buffer, here in cache before it is zeroed (read just before, as
// tiny's gradients, which stay in the last-level cache from step to step), and read again
// right after: the time of the zeroing and of that next reader together. A streaming
// store sends the lines to memory, so the reader then misses where it would have hit.
void BM_zero_then_read_paired(benchmark::State& state) {
  const auto floats = static_cast<std::size_t>(state.range(0));
  std::vector<float> grads(floats, 1.0f);
  float sink = 0.0f;
  const auto read = [&] {
    float s = 0.0f;
    for (std::size_t i = 0; i < floats; i += 16)  // one element a line: the lines' traffic
      s += grads[i];
    sink += s;
    benchmark::DoNotOptimize(sink);
  };
  const auto t = dst::bench::run_paired(
      state,
      [&] {
        std::memset(grads.data(), 0, floats * sizeof(float));
        read();
      },
      [&] {
        dst::core::stream_zero(grads.data(), floats * sizeof(float));
        read();
      },
      read);
  report(state, t, 0);
}

// Both presets' sizes, timed by the paired clock.
void presets(benchmark::internal::Benchmark* b) {
  b->ArgName("floats")->Arg(kTinyFloats)->Arg(kSmallFloats)->UseManualTime();
  b->Unit(benchmark::kMillisecond);
}

// Iterations: each evicting one costs two passes over 512 MiB, so a fixed, modest count.
BENCHMARK(BM_zero_paired)->Apply(presets)->Iterations(25);
BENCHMARK(BM_copy_half_paired)->Apply(presets)->Iterations(25);
BENCHMARK(BM_zero_then_read_paired)->Apply(presets)->Iterations(100);

}  // namespace

BENCHMARK_MAIN();
