#include "train/work_spread.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>

#include "core/error.hpp"

namespace dst::train {

StepSpread step_spread(const std::vector<double>& own_work, const std::vector<double>& own_comm,
                       const std::vector<double>& max_work, const std::vector<double>& min_work) {
  const std::size_t n = own_work.size();
  if (own_comm.size() != n || max_work.size() != n || min_work.size() != n)
    throw Error("train: step_spread needs one work, communication, maximum and minimum per step");
  StepSpread s;
  if (n == 0) return s;
  for (std::size_t k = 0; k < n; ++k) {
    s.straggle_s += max_work[k] - min_work[k];
    s.peer_wait_s += std::clamp(max_work[k] - own_work[k], 0.0, own_comm[k]);
  }
  s.straggle_s /= static_cast<double>(n);
  s.peer_wait_s /= static_cast<double>(n);
  return s;
}

WorkSpread work_spread(comm::Communicator& world, const std::vector<double>& work_s,
                       const std::vector<double>& comm_s) {
  const std::size_t n = work_s.size();
  const double mean =
      n > 0 ? std::accumulate(work_s.begin(), work_s.end(), 0.0) / static_cast<double>(n) : 0.0;
  // One all-reduce (max) of every step's work and its negative, and of the mean and its
  // negative: each step's maximum and minus its minimum, likewise for the means.
  std::vector<double> extremes(2 * n + 2);
  for (std::size_t k = 0; k < n; ++k) {
    extremes[k] = work_s[k];
    extremes[n + k] = -work_s[k];
  }
  extremes[2 * n] = mean;
  extremes[2 * n + 1] = -mean;
  world.allreduce(extremes.data(), extremes.size(), DType::f64, comm::ReduceOp::max);
  // The maximum is one rank's own value, bit for bit: the lowest rank holding it.
  std::int64_t slowest =
      mean == extremes[2 * n] ? world.rank() : std::numeric_limits<std::int64_t>::max();
  world.allreduce(&slowest, 1, DType::i64, comm::ReduceOp::min);
  std::vector<double> max_work(extremes.begin(), extremes.begin() + static_cast<std::ptrdiff_t>(n));
  std::vector<double> min_work(n);
  for (std::size_t k = 0; k < n; ++k)
    min_work[k] = -extremes[n + k];
  return WorkSpread{-extremes[2 * n + 1], extremes[2 * n], static_cast<int>(slowest),
                    step_spread(work_s, comm_s, max_work, min_work)};
}

}  // namespace dst::train
