#pragma once
// Paired timing for Google Benchmark: two ways of doing the same work, one right after the
// other in every iteration, the order alternating, so that the host's drift (10-30% between
// minutes on a shared VM, more than most differences worth measuring) moves both alike.
// The iteration's time (UseManualTime) is the candidate's; compare the two by the median of
// the per-iteration ratios (PairedTimes::median_ratio), not by the two medians.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <vector>

namespace dst::bench {

inline double median_of(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct PairedTimes {
  std::vector<double> baseline, candidate;  // seconds, one per iteration
  /// The median over iterations of baseline time / candidate time (above 1: the candidate
  /// is faster).
  double median_ratio() const {
    std::vector<double> r;
    for (std::size_t i = 0; i < baseline.size(); ++i)
      r.push_back(candidate[i] > 0 ? baseline[i] / candidate[i] : 0.0);
    return median_of(r);
  }
};

/// Runs baseline() and candidate() once per iteration of `state`, alternating which goes
/// first; each call is timed alone (work the callables do before the clock starts, such as
/// evicting caches, belongs in `prepare`, called before each of them, untimed).
template <class Baseline, class Candidate, class Prepare>
PairedTimes run_paired(benchmark::State& state, Baseline&& baseline, Candidate&& candidate,
                       Prepare&& prepare) {
  using Clock = std::chrono::steady_clock;
  PairedTimes t;
  bool candidate_first = false;
  for (auto _ : state) {
    double seconds[2] = {0, 0};  // [baseline, candidate]
    for (const bool is_candidate : {candidate_first, !candidate_first}) {
      prepare();
      const auto t0 = Clock::now();
      if (is_candidate)
        candidate();
      else
        baseline();
      seconds[is_candidate ? 1 : 0] = std::chrono::duration<double>(Clock::now() - t0).count();
    }
    candidate_first = !candidate_first;
    state.SetIterationTime(seconds[1]);
    t.baseline.push_back(seconds[0]);
    t.candidate.push_back(seconds[1]);
  }
  return t;
}

template <class Baseline, class Candidate>
PairedTimes run_paired(benchmark::State& state, Baseline&& baseline, Candidate&& candidate) {
  return run_paired(state, baseline, candidate, [] {});
}

}  // namespace dst::bench
