// What the trainer's instrumentation costs per call (docs/performance.md, "overhead of
// the phase timers and the flight recorder"): a steady_clock reading (each phase timer is
// two), a flight-recorder scope (begin + end: a lock and a string copy each), and the
// heartbeat the hang watchdog reads. A training step makes a few of each per micro-batch
// and per collective, against steps of tens to thousands of milliseconds.
#include <benchmark/benchmark.h>

#include <chrono>
#include <string>

#include "core/flight_recorder.hpp"

namespace {

void BM_steady_clock_now(benchmark::State& state) {
  for (auto _ : state)
    benchmark::DoNotOptimize(std::chrono::steady_clock::now());
}
BENCHMARK(BM_steady_clock_now);

void BM_phase_timer(benchmark::State& state) {  // start, stop, accumulate: one phase
  double total = 0.0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    benchmark::DoNotOptimize(total);
  }
}
BENCHMARK(BM_phase_timer);

void BM_flight_scope(benchmark::State& state) {  // what each collective and phase records
  const std::string what =
      "comm: allreduce(sum) of 3297536 x f32 (13190144 B) on group 'data' (2 ranks)";
  for (auto _ : state) {
    dst::core::FlightScope scope(what);
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_flight_scope);

void BM_heartbeat_read(benchmark::State& state) {  // the watchdog's check, once a second
  auto& recorder = dst::core::FlightRecorder::instance();
  for (auto _ : state)
    benchmark::DoNotOptimize(recorder.seconds_since_progress());
}
BENCHMARK(BM_heartbeat_read);

}  // namespace

BENCHMARK_MAIN();
