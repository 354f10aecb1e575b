#pragma once
/// \file work_spread.hpp
/// How far the ranks' work per step (data + forward + backward: what a rank does before
/// it waits for its peers' gradients) lay apart, over a run of steps: the straggler
/// statistics of the metrics' phases records.

#include <vector>

#include "comm/communicator.hpp"

namespace dst::train {

/// Step by step, how far the ranks' work (data + forward + backward) lay apart, and how
/// much of one rank's exposed communication was waiting for a slower rank's work rather
/// than the gradients' own sum. Means over the steps, seconds.
struct StepSpread {
  /// slowest rank's work - fastest rank's work
  double straggle_s = 0.0;
  /// this rank's: min(its exposed communication, slowest rank's work - its own work). The
  /// ranks start a step together (the previous step ends in a collective), so until the
  /// slowest rank's work is done no sum can complete: that much of the wait is the peer's,
  /// whatever the network; the rest of the exposed communication is the sum's own tail.
  double peer_wait_s = 0.0;
};
/// StepSpread from this rank's work and exposed communication per step and every step's
/// highest and lowest work over the ranks (vectors of one length; empty gives zeros).
StepSpread step_spread(const std::vector<double>& own_work, const std::vector<double>& own_comm,
                       const std::vector<double>& max_work, const std::vector<double>& min_work);

/// How a rank's work per step compares across the ranks, over a run of steps.
struct WorkSpread {
  double min_s = 0.0, max_s = 0.0;  ///< the ranks' mean work per step: lowest, highest
  int slowest_rank = 0;             ///< the lowest rank with max_s
  StepSpread per_step;              ///< step by step (a slow rank that changes from step
                                    ///< to step evens out in the means above, not here)
};
/// WorkSpread over `world`. `work_s` and `comm_s`: this rank's work and exposed
/// communication (StepStats::t_comm) of each of those steps, the same steps on every
/// rank. Collective over `world` (two all-reduces: 2 x steps + 2 doubles, one integer).
WorkSpread work_spread(comm::Communicator& world, const std::vector<double>& work_s,
                       const std::vector<double>& comm_s);

}  // namespace dst::train
