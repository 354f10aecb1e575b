#include "core/log.hpp"

#include <atomic>
#include <cstdio>
#include <mutex>

#include "core/error.hpp"

namespace dst::log {

namespace {
std::atomic<int> g_level{static_cast<int>(Level::info)};
std::atomic<int> g_rank{-1};
std::mutex g_mutex;  // one line at a time when several threads log (watchdog, reader)
}  // namespace

Level parse_level(std::string_view name) {
  if (name == "debug") return Level::debug;
  if (name == "info") return Level::info;
  if (name == "warn" || name == "warning") return Level::warn;
  if (name == "error") return Level::error;
  if (name == "off") return Level::off;
  throw UsageError("log level must be one of debug, info, warn, error, off; got '" +
                   std::string(name) + "'");
}

std::string_view level_name(Level level) {
  switch (level) {
    case Level::debug:
      return "debug";
    case Level::info:
      return "info";
    case Level::warn:
      return "warn";
    case Level::error:
      return "error";
    case Level::off:
      return "off";
  }
  return "?";
}

void set_level(Level level) {
  g_level.store(static_cast<int>(level));
}
Level level() {
  return static_cast<Level>(g_level.load());
}
void set_rank(int r) {
  g_rank.store(r);
}
int rank() {
  return g_rank.load();
}

std::string rank_prefix() {
  const int r = rank();
  return r < 0 ? std::string("[rank ?]") : "[rank " + std::to_string(r) + "]";
}

void write(Level lvl, std::string_view message, bool all_ranks) {
  if (lvl < level() || lvl == Level::off) return;
  const int r = rank();
  const bool problem = lvl >= Level::warn;
  if (!problem && !all_ranks && r > 0) return;  // progress: rank 0 (or unknown) only
  std::string line;
  if (problem) {
    line = rank_prefix() + (lvl == Level::warn ? " warning: " : " error: ");
  } else if (all_ranks && r >= 0) {
    line = rank_prefix() + " ";
  }
  line.append(message);
  line.push_back('\n');
  std::lock_guard<std::mutex> lock(g_mutex);
  std::FILE* out = problem ? stderr : stdout;
  std::fwrite(line.data(), 1, line.size(), out);
  std::fflush(out);
}

}  // namespace dst::log
