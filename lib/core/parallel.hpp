#pragma once
/// \file parallel.hpp
/// Host threads for the start-up work no back end runs, such as drawing the initial
/// weights (rng.hpp: each value a pure function of its index, so any split gives the
/// same bits): a range cut into contiguous slices, one thread each.

#include <cstdint>
#include <functional>
#include <vector>

namespace dst::core {

/// The CPUs this process may run on (its affinity mask, sched_getaffinity: under `mpirun`
/// or `srun` with binding, the rank's own cores), ascending; empty if it cannot be read.
std::vector<int> affinity_cpus();

/// How many: affinity_cpus().size(), or the machine's count where the mask cannot be read;
/// at least 1.
unsigned usable_cpus();

/// Calls fn(begin, end) for contiguous slices covering [0, n): at most `threads` slices
/// (0: usable_cpus()), none shorter than `min_slice` elements unless n is, each on its own
/// thread (the caller runs the first). Returns when every slice is done; an exception
/// from a slice is rethrown then (the first slice's first).
void parallel_slices(std::uint64_t n, unsigned threads, std::uint64_t min_slice,
                     const std::function<void(std::uint64_t, std::uint64_t)>& fn);

}  // namespace dst::core
