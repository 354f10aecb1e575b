#pragma once
/// \file pipeline_schedule.hpp
/// The order in which one pipeline stage runs the forwards and backwards of a step's
/// micro-batches (parallel.pipeline_schedule 1f1b; Narayanan et al. 2021, "PipeDream-
/// Flush"): stage s of P first runs min(P - 1 - s, m) forwards (the warm-up), then
/// alternates one forward and one backward until every forward is done, then runs the
/// remaining backwards. Micro-batches go forward and backward in order 0 .. m - 1.
///
/// What it guarantees (tests/unit/model/pipeline_schedule_test.cpp): every micro-batch's
/// forward and backward exactly once per stage, a backward after its own forward, at most
/// min(P - s, m) micro-batches in flight on stage s (forward done, backward not yet: the
/// activation records a stage keeps), and, run by all stages with blocking sends and
/// receives between neighbours, no deadlock.
///
/// `interleaved` is the order of the interleaved schedule (Narayanan et al. 2021, section
/// 2.2; Megatron-LM's virtual pipeline): each of the P ranks holds V model chunks, chunk c of
/// rank p being virtual stage c * P + p of P * V, so the bubble shrinks to (P - 1) / (V * m).
/// The trainer runs it (parallel.pipeline_schedule interleaved, parallel.virtual_stages V):
/// each chunk keeps one activation record per micro-batch it has in flight
/// (chunk_in_flight).

#include <cstdint>
#include <string>
#include <vector>

namespace dst::model {

struct PipeOp {
  enum class Kind { forward, backward };
  Kind kind = Kind::forward;
  std::int64_t micro = 0;  ///< the micro-batch, 0 .. m - 1
  int chunk = 0;           ///< the model chunk of the rank, 0 .. V - 1 (0 under 1F1B)
  bool operator==(const PipeOp& o) const {
    return kind == o.kind && micro == o.micro && chunk == o.chunk;
  }
};

/// The 1F1B order of stage `stage` of `stages` over `micro_batches` micro-batches. Throws
/// dst::Error for stages < 1, a stage outside [0, stages) or micro_batches < 1.
std::vector<PipeOp> one_f_one_b(int stages, int stage, std::int64_t micro_batches);

/// The most micro-batches stage `stage` keeps in flight under 1F1B: min(stages - stage, m).
std::int64_t max_in_flight(int stages, int stage, std::int64_t micro_batches);

/// The bubble fraction of 1F1B, (P - 1) / m: the idle time of a stage relative to its
/// busy time when forward and backward of every stage take equal time. With `chunks` V
/// model chunks per rank (the interleaved schedule) it is (P - 1) / (V * m): the warm-up
/// and cool-down run chunks of 1 / V of a stage's layers.
double bubble_fraction(int stages, std::int64_t micro_batches, int chunks = 1);

/// The interleaved order of rank `stage` of `stages` holding `chunks` model chunks, over
/// `micro_batches` micro-batches. The m * V (micro-batch, chunk) forwards go in groups of P
/// micro-batches: micro-batches g * P .. g * P + P - 1 through chunk 0, then the same
/// through chunk 1, ..., then group g + 1; backwards go in the same order with the chunks
/// reversed (V - 1 first). The rank first runs the warm-up, (P - stage - 1) * 2 + (V - 1) * P
/// forwards clipped to m * V, then alternates one forward and one backward, then runs the
/// remaining backwards. The factor 2 is Megatron-LM's: it leaves each rank one op of slack
/// to hide a transfer's latency behind compute (a simulation with transfer time 0.2 of a
/// forward: P 4, V 2, m 16 finish in 55 instead of 63 forward times). With one chunk the
/// order is one_f_one_b's exactly. Throws dst::Error for the arguments one_f_one_b
/// refuses, chunks < 1, or, with chunks > 1, micro_batches not a multiple of stages (the
/// groups of P would be ragged; the deck names training.grad_accum_steps).
std::vector<PipeOp> interleaved(int stages, int stage, int chunks, std::int64_t micro_batches);

/// The most (micro-batch, chunk) pairs rank `stage` keeps in flight under `interleaved`
/// (the warm-up plus one, at most m * V); max_in_flight for one chunk.
std::int64_t max_in_flight(int stages, int stage, int chunks, std::int64_t micro_batches);

/// The most micro-batches each of rank `stage`'s `chunks` model chunks keeps in flight at once
/// under `interleaved` (forward done, backward not yet), chunk 0 first: the activation
/// records each chunk needs. Each chunk runs its micro-batches forward and backward in
/// order 0 .. m - 1, so micro-batch i may use record i mod chunk_in_flight()[chunk]. Their
/// sum is at least max_in_flight(stages, stage, chunks, m) (the peaks of the chunks need not
/// coincide); the last rank's last chunk (the head's) has 1. One chunk:
/// {max_in_flight(stages, stage, m)}.
std::vector<std::int64_t> chunk_in_flight(int stages, int stage, int chunks,
                                          std::int64_t micro_batches);

/// "F0 F1 B0 F2 B1 B2" (tests and logs); an op of chunk c > 0 reads "F0c1".
std::string describe(const std::vector<PipeOp>& ops);

}  // namespace dst::model
