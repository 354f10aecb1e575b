#pragma once
// Pushes every cache level out before a timed call, for benchmarks of work that in a
// training step finds its operands in memory (a layer product, a whole-buffer write).
#include <benchmark/benchmark.h>

#include <cstddef>
#include <vector>

namespace dst::bench {

// Bytes written by evict_caches() so that nothing measured is still in any cache level:
// more than this VM's whole L3 (lscpu: 260-480 MiB on the hosts so far, one instance
// shared by all its guests) and than a training step's memory (tiny: ~350 MB).
constexpr std::size_t kEvictBytes = std::size_t{512} << 20;

// Writes one float in every 64-byte line of a buffer larger than the caches: ordinary
// loads and stores, which bring each line into cache (a large memset may itself stream
// and so evict nothing).
inline void evict_caches() {
  static std::vector<float> junk(kEvictBytes / sizeof(float), 0.0F);
  for (std::size_t i = 0; i < junk.size(); i += 64 / sizeof(float))
    junk[i] += 1.0F;
  benchmark::DoNotOptimize(junk.data());
  benchmark::ClobberMemory();
}

}  // namespace dst::bench
