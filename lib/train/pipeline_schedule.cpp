#include "train/pipeline_schedule.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace dst::train {

namespace {
void check(int stages, int stage, std::int64_t micro_batches) {
  if (stages < 1 || stage < 0 || stage >= stages || micro_batches < 1)
    throw Error("train: no pipeline schedule for stage " + std::to_string(stage) + " of " +
                std::to_string(stages) + " over " + std::to_string(micro_batches) +
                " micro-batches (stages >= 1, 0 <= stage < stages, micro-batches >= 1)");
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

double bubble_fraction(int stages, std::int64_t micro_batches) {
  check(stages, 0, micro_batches);
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches);
}

std::string describe(const std::vector<PipeOp>& ops) {
  std::string out;
  for (const PipeOp& op : ops)
    out += (out.empty() ? "" : " ") + std::string(op.kind == PipeOp::Kind::forward ? "F" : "B") +
           std::to_string(op.micro);
  return out;
}

}  // namespace dst::train
