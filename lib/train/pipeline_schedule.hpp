#pragma once
/// \file pipeline_schedule.hpp
/// The order in which one pipeline stage runs the forwards and backwards of a step's
/// micro-batches (parallel.pipeline_schedule 1f1b; Narayanan et al. 2021, "PipeDream-
/// Flush"): stage s of P first runs min(P - 1 - s, m) forwards (the warm-up), then
/// alternates one forward and one backward until every forward is done, then runs the
/// remaining backwards. Micro-batches go forward and backward in order 0 .. m - 1.
///
/// What it guarantees (tests/unit/train/pipeline_schedule_test.cpp): every micro-batch's
/// forward and backward exactly once per stage, a backward after its own forward, at most
/// min(P - s, m) micro-batches in flight on stage s (forward done, backward not yet: the
/// activation records a stage keeps), and, run by all stages with blocking sends and
/// receives between neighbours, no deadlock.

#include <cstdint>
#include <string>
#include <vector>

namespace dst::train {

struct PipeOp {
  enum class Kind { forward, backward };
  Kind kind = Kind::forward;
  std::int64_t micro = 0;  ///< the micro-batch, 0 .. m - 1
  bool operator==(const PipeOp& o) const { return kind == o.kind && micro == o.micro; }
};

/// The 1F1B order of stage `stage` of `stages` over `micro_batches` micro-batches. Throws
/// dst::Error for stages < 1, a stage outside [0, stages) or micro_batches < 1.
std::vector<PipeOp> one_f_one_b(int stages, int stage, std::int64_t micro_batches);

/// The most micro-batches stage `stage` keeps in flight under 1F1B: min(stages - stage, m).
std::int64_t max_in_flight(int stages, int stage, std::int64_t micro_batches);

/// The bubble fraction of 1F1B, (P - 1) / m: the idle time of a stage relative to its
/// busy time when forward and backward of every stage take equal time.
double bubble_fraction(int stages, std::int64_t micro_batches);

/// "F0 F1 B0 F2 B1 B2" (tests and logs).
std::string describe(const std::vector<PipeOp>& ops);

}  // namespace dst::train
