#include "runtime/signals.hpp"

#include <atomic>
#include <csignal>
#include <cstring>

namespace dst::runtime {

namespace {
// Lock-free atomics are async-signal-safe.
std::atomic<int> first_signal{0};
std::atomic<int> signal_count{0};
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void on_stop_signal(int signo) {
  int expected = 0;
  first_signal.compare_exchange_strong(expected, signo);
  signal_count.fetch_add(1);
}
}  // namespace

void install_stop_handlers() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // interrupted system calls (file I/O, MPI's polls) resume
  for (const int s : {SIGUSR1, SIGTERM, SIGINT})
    sigaction(s, &sa, nullptr);
}

void ignore_file_size_signal() {
  std::signal(SIGXFSZ, SIG_IGN);
}

int stop_signal() {
  return first_signal.load();
}

int stop_signal_count() {
  return signal_count.load();
}

std::string signal_name(int signo) {
  switch (signo) {
    case SIGUSR1:
      return "SIGUSR1";
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    default:
      return "signal " + std::to_string(signo);
  }
}

void reset_stop_signal() {
  first_signal.store(0);
  signal_count.store(0);
}

}  // namespace dst::runtime
