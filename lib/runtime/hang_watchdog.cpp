#include "runtime/hang_watchdog.hpp"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include "core/exit_codes.hpp"
#include "core/flight_recorder.hpp"
#include "core/log.hpp"
#include "core/step_context.hpp"

namespace dst::runtime {

struct HangWatchdog::State {
  std::mutex mutex;
  std::condition_variable wake;
  bool stop = false;
  std::thread thread;
};

HangWatchdog::HangWatchdog(double timeout_s) : state_(new State) {
  if (timeout_s <= 0) return;
  core::FlightRecorder::instance().beat();
  const double limit = timeout_s + kGraceSeconds;
  state_->thread = std::thread([s = state_, timeout_s, limit] {
    // Check a few times per timeout, at least once a second.
    const auto period = std::chrono::duration<double>(std::min(1.0, limit / 4));
    std::unique_lock<std::mutex> lock(s->mutex);
    while (!s->wake.wait_for(lock, period, [s] { return s->stop; })) {
      auto& recorder = core::FlightRecorder::instance();
      const double idle = recorder.seconds_since_progress();
      if (idle < limit) continue;
      std::string what = recorder.in_flight();
      if (what.empty()) what = "no recorded operation (between operations)";
      char head[96];
      std::snprintf(head, sizeof head, "no progress for %.0f s (parallel.timeout_s %g + %g s) at ",
                    idle, timeout_s, kGraceSeconds);
      log::error(std::string(head) + core::describe_current_step() + ": stuck in " + what +
                 "\nrecent operations on this rank (flight recorder, oldest first):\n" +
                 recorder.report());
      std::fflush(nullptr);
      std::_Exit(kExitTimeout);
    }
  });
}

HangWatchdog::~HangWatchdog() {
  if (state_->thread.joinable()) {
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      state_->stop = true;
    }
    state_->wake.notify_all();
    state_->thread.join();
  }
  delete state_;
}

}  // namespace dst::runtime
