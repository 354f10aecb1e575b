#include "runtime/startup_watchdog.hpp"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <thread>

#include "core/exit_codes.hpp"
#include "core/log.hpp"

namespace dst::runtime {

struct StartupWatchdog::State {
  using Clock = std::chrono::steady_clock;
  mutable std::mutex mutex;
  std::condition_variable cv;
  std::string step;
  double timeout_s = 0.0;
  Clock::time_point deadline{};
  bool active = false;
  bool stop = false;
  std::thread thread;
};

StartupWatchdog::StartupWatchdog() : state_(new State) {
  state_->thread = std::thread([s = state_] {
    std::unique_lock<std::mutex> lock(s->mutex);
    while (!s->stop) {
      if (!s->active) {
        s->cv.wait(lock);
        continue;
      }
      if (s->cv.wait_until(lock, s->deadline) == std::cv_status::timeout && s->active && !s->stop &&
          State::Clock::now() >= s->deadline) {
        std::ostringstream os;
        os << "start-up step '" << s->step << "' did not finish within " << s->timeout_s
           << " s (a peer rank is missing or hung, or the launcher/network is stuck); "
              "ending this rank";
        log::error(os.str());
        std::fflush(nullptr);
        std::_Exit(kExitTimeout);
      }
    }
  });
}

StartupWatchdog::~StartupWatchdog() {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stop = true;
  }
  state_->cv.notify_all();
  state_->thread.join();
  delete state_;
}

void StartupWatchdog::begin(const std::string& step, double timeout_s) {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->step = step;
    state_->timeout_s = timeout_s;
    state_->active = timeout_s > 0.0;
    state_->deadline = State::Clock::now() + std::chrono::duration_cast<State::Clock::duration>(
                                                 std::chrono::duration<double>(timeout_s));
  }
  state_->cv.notify_all();
}

void StartupWatchdog::done() {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->active = false;
    state_->step.clear();
  }
  state_->cv.notify_all();
}

std::string StartupWatchdog::current() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->step;
}

}  // namespace dst::runtime
