#include "model/pipeline_schedule.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace dst::model {

namespace {
void check(int stages, int stage, std::int64_t micro_batches) {
  if (stages < 1 || stage < 0 || stage >= stages || micro_batches < 1)
    throw Error("train: no pipeline schedule for stage " + std::to_string(stage) + " of " +
                std::to_string(stages) + " over " + std::to_string(micro_batches) +
                " micro-batches (stages >= 1, 0 <= stage < stages, micro-batches >= 1)");
}

/// The forwards rank `stage` runs before its first backward under `interleaved`.
std::int64_t interleaved_warmup(int stages, int stage, int chunks, std::int64_t micro_batches) {
  check(stages, stage, micro_batches);
  if (chunks < 1)
    throw Error("train: no interleaved pipeline schedule for " + std::to_string(chunks) +
                " model chunks per rank (chunks >= 1)");
  if (chunks == 1) return std::min<std::int64_t>(stages - 1 - stage, micro_batches);
  if (micro_batches % stages != 0)
    throw Error("train: the interleaved pipeline schedule runs micro-batches in groups of the " +
                std::to_string(stages) + " pipeline stages, but a step has " +
                std::to_string(micro_batches) +
                " (make training.grad_accum_steps a multiple of parallel.pipeline)");
  const std::int64_t warmup = static_cast<std::int64_t>(stages - stage - 1) * 2 +
                              static_cast<std::int64_t>(chunks - 1) * stages;
  return std::min<std::int64_t>(warmup, micro_batches * chunks);
}
}  // namespace

std::vector<PipeOp> one_f_one_b(int stages, int stage, std::int64_t micro_batches) {
  check(stages, stage, micro_batches);
  const std::int64_t m = micro_batches;
  const std::int64_t warmup = std::min<std::int64_t>(stages - 1 - stage, m);
  std::vector<PipeOp> ops;
  ops.reserve(static_cast<std::size_t>(2 * m));
  for (std::int64_t i = 0; i < warmup; ++i)
    ops.push_back({PipeOp::Kind::forward, i});
  for (std::int64_t i = 0; i < m - warmup; ++i) {
    ops.push_back({PipeOp::Kind::forward, warmup + i});
    ops.push_back({PipeOp::Kind::backward, i});
  }
  for (std::int64_t i = m - warmup; i < m; ++i)
    ops.push_back({PipeOp::Kind::backward, i});
  return ops;
}

std::int64_t max_in_flight(int stages, int stage, std::int64_t micro_batches) {
  check(stages, stage, micro_batches);
  return std::min<std::int64_t>(stages - stage, micro_batches);
}

double bubble_fraction(int stages, std::int64_t micro_batches, int chunks) {
  check(stages, 0, micro_batches);
  if (chunks < 1)
    throw Error("train: no pipeline bubble for " + std::to_string(chunks) +
                " model chunks per rank (chunks >= 1)");
  return static_cast<double>(stages - 1) / static_cast<double>(chunks * micro_batches);
}

std::vector<PipeOp> interleaved(int stages, int stage, int chunks, std::int64_t micro_batches) {
  const std::int64_t warmup = interleaved_warmup(stages, stage, chunks, micro_batches);
  if (chunks == 1) return one_f_one_b(stages, stage, micro_batches);
  const std::int64_t total = micro_batches * chunks;
  const std::int64_t group = static_cast<std::int64_t>(stages) * chunks;
  // The k-th forward (backward) of the rank: group k / (P * V) of P micro-batches, chunk
  // (k mod (P * V)) / P of it (reversed for backwards), micro-batch k mod P of the group.
  const auto op = [&](PipeOp::Kind kind, std::int64_t k) {
    const auto in_group_chunk = static_cast<int>((k % group) / stages);
    return PipeOp{kind, (k / group) * stages + k % stages,
                  kind == PipeOp::Kind::forward ? in_group_chunk : chunks - 1 - in_group_chunk};
  };
  std::vector<PipeOp> ops;
  ops.reserve(static_cast<std::size_t>(2 * total));
  for (std::int64_t k = 0; k < warmup; ++k)
    ops.push_back(op(PipeOp::Kind::forward, k));
  for (std::int64_t k = 0; k < total - warmup; ++k) {
    ops.push_back(op(PipeOp::Kind::forward, warmup + k));
    ops.push_back(op(PipeOp::Kind::backward, k));
  }
  for (std::int64_t k = total - warmup; k < total; ++k)
    ops.push_back(op(PipeOp::Kind::backward, k));
  return ops;
}

std::int64_t max_in_flight(int stages, int stage, int chunks, std::int64_t micro_batches) {
  const std::int64_t warmup = interleaved_warmup(stages, stage, chunks, micro_batches);
  return std::min<std::int64_t>(warmup + 1, micro_batches * chunks);
}

std::vector<std::int64_t> chunk_in_flight(int stages, int stage, int chunks,
                                          std::int64_t micro_batches) {
  std::vector<std::int64_t> now(static_cast<std::size_t>(std::max(chunks, 1)), 0);
  std::vector<std::int64_t> peak = now;
  for (const PipeOp& op : interleaved(stages, stage, chunks, micro_batches)) {
    const auto c = static_cast<std::size_t>(op.chunk);
    now[c] += op.kind == PipeOp::Kind::forward ? 1 : -1;
    peak[c] = std::max(peak[c], now[c]);
  }
  return peak;
}

std::string describe(const std::vector<PipeOp>& ops) {
  std::string out;
  for (const PipeOp& op : ops)
    out += (out.empty() ? "" : " ") + std::string(op.kind == PipeOp::Kind::forward ? "F" : "B") +
           std::to_string(op.micro) + (op.chunk > 0 ? "c" + std::to_string(op.chunk) : "");
  return out;
}

}  // namespace dst::model
