#include "core/parallel.hpp"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <exception>
#include <system_error>
#include <thread>
#include <vector>

namespace dst::core {

std::vector<int> affinity_cpus() {
  // cpu_set_t holds 1024 CPUs; a kernel built for more refuses it (EINVAL): grow.
  for (int n = CPU_SETSIZE; n <= (1 << 16); n *= 2) {
    cpu_set_t* set = CPU_ALLOC(static_cast<std::size_t>(n));
    if (!set) return {};
    const std::size_t bytes = CPU_ALLOC_SIZE(static_cast<std::size_t>(n));
    CPU_ZERO_S(bytes, set);
    std::vector<int> cpus;
    const bool ok = sched_getaffinity(0, bytes, set) == 0;
    const int err = errno;
    if (ok)
      for (int c = 0; c < n; ++c)
        if (CPU_ISSET_S(static_cast<std::size_t>(c), bytes, set)) cpus.push_back(c);
    CPU_FREE(set);
    if (ok) return cpus;
    if (err != EINVAL) return {};
  }
  return {};
}

unsigned usable_cpus() {
  const std::size_t n = affinity_cpus().size();
  if (n > 0) return static_cast<unsigned>(n);
  return std::max(1u, std::thread::hardware_concurrency());
}

void parallel_slices(const std::uint64_t n, unsigned threads, const std::uint64_t min_slice,
                     const std::function<void(std::uint64_t, std::uint64_t)>& fn) {
  if (n == 0) return;
  if (threads == 0) threads = usable_cpus();
  const std::uint64_t by_size =
      std::max<std::uint64_t>(1, n / std::max<std::uint64_t>(1, min_slice));
  const auto slices = static_cast<unsigned>(std::min<std::uint64_t>(threads, by_size));
  if (slices <= 1) {
    fn(0, n);
    return;
  }
  auto bound = [&](const unsigned s) {
    return n / slices * s + std::min<std::uint64_t>(s, n % slices);
  };
  std::vector<std::exception_ptr> errors(slices);
  auto run = [&](const unsigned s) {
    try {
      fn(bound(s), bound(s + 1));
    } catch (...) {
      errors[s] = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(slices - 1);
  try {
    for (unsigned s = 1; s < slices; ++s)
      pool.emplace_back(run, s);
  } catch (const std::system_error&) {
    // No more threads to be had (a process or cgroup limit): this thread runs the rest.
  }
  run(0);
  for (auto s = static_cast<unsigned>(pool.size()) + 1; s < slices; ++s)
    run(s);
  for (auto& t : pool)
    t.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace dst::core
