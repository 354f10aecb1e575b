#pragma once
/// \file flight_recorder.hpp
/// What this rank did last, for the report of a hang: a small ring of the most recent
/// operations (collectives, checkpoint and data I/O, training phases) with their start
/// times and whether they finished, and a heartbeat (the time of the last begin or end)
/// that the hang watchdog (runtime/hang_watchdog.hpp) watches. Thread-safe; one per
/// process. Recording costs a lock and a string copy (well under a microsecond), so it
/// is for operations, not for inner loops.

#include <chrono>
#include <cstdint>
#include <string>

namespace dst::core {

class FlightRecorder {
 public:
  static FlightRecorder& instance();

  /// Records the start of `what` (e.g. "allreduce(sum) of 3 x f64 on group 'data'");
  /// returns its sequence number for end().
  std::uint64_t begin(std::string what);
  /// Records that operation `seq` finished.
  void end(std::uint64_t seq);
  /// Progress without an operation (e.g. a step finished).
  void beat();

  /// Seconds since the last begin(), end() or beat().
  double seconds_since_progress() const;
  /// The oldest operation still in flight, "" when none.
  std::string in_flight() const;
  /// The last `n` operations, oldest first, one per line:
  /// "  #41  step 12  allreduce(sum) ... on group 'data' (2 ranks): done in 0.3 ms"
  /// "  #42  step 12  ... : IN FLIGHT for 61.2 s".
  std::string report(std::size_t n = 12) const;

  /// Forgets everything (tests).
  void clear();

 private:
  FlightRecorder() = default;
};

/// begin() now, end() when the scope ends (normally or by exception).
class FlightScope {
 public:
  explicit FlightScope(std::string what)
      : seq_(FlightRecorder::instance().begin(std::move(what))) {}
  ~FlightScope() { FlightRecorder::instance().end(seq_); }
  FlightScope(const FlightScope&) = delete;
  FlightScope& operator=(const FlightScope&) = delete;

 private:
  std::uint64_t seq_;
};

}  // namespace dst::core
