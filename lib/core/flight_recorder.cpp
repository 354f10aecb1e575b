#include "core/flight_recorder.hpp"

#include <array>
#include <cstdio>
#include <mutex>

#include "core/step_context.hpp"

namespace dst::core {

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kRing = 64;

struct Entry {
  std::uint64_t seq = 0;  ///< 0 = empty slot
  std::int64_t step = kStartupStep;
  std::string what;
  Clock::time_point start{};
  Clock::time_point finish{};
  bool done = false;
};

struct Ring {
  mutable std::mutex mutex;
  std::array<Entry, kRing> entries;
  std::uint64_t next = 1;
  Clock::time_point last_progress = Clock::now();
};

Ring& ring() {
  static Ring r;
  return r;
}

double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

FlightRecorder& FlightRecorder::instance() {
  static FlightRecorder recorder;
  return recorder;
}

std::uint64_t FlightRecorder::begin(std::string what) {
  Ring& r = ring();
  const auto now = Clock::now();
  const std::int64_t step = current_step();
  std::lock_guard<std::mutex> lock(r.mutex);
  const std::uint64_t seq = r.next++;
  Entry& e = r.entries[seq % kRing];
  e.seq = seq;
  e.step = step;
  e.what = std::move(what);
  e.start = now;
  e.done = false;
  r.last_progress = now;
  return seq;
}

void FlightRecorder::end(std::uint64_t seq) {
  Ring& r = ring();
  const auto now = Clock::now();
  std::lock_guard<std::mutex> lock(r.mutex);
  Entry& e = r.entries[seq % kRing];
  if (e.seq == seq) {  // else overwritten by 64 newer operations: nothing to mark
    e.done = true;
    e.finish = now;
  }
  r.last_progress = now;
}

void FlightRecorder::beat() {
  Ring& r = ring();
  const auto now = Clock::now();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.last_progress = now;
}

double FlightRecorder::seconds_since_progress() const {
  Ring& r = ring();
  std::lock_guard<std::mutex> lock(r.mutex);
  return seconds(Clock::now() - r.last_progress);
}

std::string FlightRecorder::in_flight() const {
  Ring& r = ring();
  std::lock_guard<std::mutex> lock(r.mutex);
  const Entry* oldest = nullptr;
  for (const Entry& e : r.entries)
    if (e.seq != 0 && !e.done && (!oldest || e.seq < oldest->seq)) oldest = &e;
  return oldest ? oldest->what : std::string();
}

std::string FlightRecorder::report(std::size_t n) const {
  Ring& r = ring();
  const auto now = Clock::now();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::string out;
  const std::uint64_t last = r.next - 1;
  const std::uint64_t first = last >= n ? last - n + 1 : 1;
  for (std::uint64_t seq = first; seq <= last && seq > 0; ++seq) {
    const Entry& e = r.entries[seq % kRing];
    if (e.seq != seq) continue;
    char tail[96];
    if (e.done)
      std::snprintf(tail, sizeof tail, ": done in %.1f ms", 1e3 * seconds(e.finish - e.start));
    else
      std::snprintf(tail, sizeof tail, ": IN FLIGHT for %.1f s", seconds(now - e.start));
    out += "  #" + std::to_string(seq) + "  " +
           (e.step == kStartupStep ? std::string("start-up") : "step " + std::to_string(e.step)) +
           "  " + e.what + tail + "\n";
  }
  return out.empty() ? "  (no operations recorded)\n" : out;
}

void FlightRecorder::clear() {
  Ring& r = ring();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.entries = {};
  r.next = 1;
  r.last_progress = Clock::now();
}

}  // namespace dst::core
