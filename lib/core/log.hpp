#pragma once
/// \file log.hpp
/// Rank-aware logging. Progress (info, debug) is printed by rank 0 only, so a job of
/// 1000 ranks prints one line per event; warnings and errors are printed by whichever
/// rank has them, prefixed with `[rank R]`. Info goes to stdout, warnings and errors to
/// stderr. The rank is set once MPI is up; before that it is unknown and every process
/// prints (prefixed `[rank ?]` for warnings and errors).

#include <sstream>
#include <string>
#include <string_view>

namespace dst::log {

enum class Level { debug = 0, info = 1, warn = 2, error = 3, off = 4 };

/// Parses "debug", "info", "warn"/"warning", "error", "off"; throws dst::UsageError.
Level parse_level(std::string_view name);
std::string_view level_name(Level level);

void set_level(Level level);
Level level();

/// Tells the logger which rank this process is (-1 = unknown).
void set_rank(int rank);
int rank();

/// Writes one message if `level` is enabled and this rank prints that level.
/// `all_ranks` makes info/debug print on every rank (prefixed with the rank).
void write(Level level, std::string_view message, bool all_ranks = false);

/// The `[rank R]` prefix of this process ("[rank ?]" before MPI is up).
std::string rank_prefix();

inline void debug(std::string_view m) {
  write(Level::debug, m);
}
inline void info(std::string_view m) {
  write(Level::info, m);
}
inline void warn(std::string_view m) {
  write(Level::warn, m);
}
inline void error(std::string_view m) {
  write(Level::error, m);
}

}  // namespace dst::log

/// Streams into a log line: DST_LOG(info, "step " << s << " loss " << l).
#define DST_LOG(lvl, msg)                                           \
  do {                                                              \
    if (::dst::log::Level::lvl >= ::dst::log::level()) {            \
      std::ostringstream dst_log_os_;                               \
      dst_log_os_ << msg;                                           \
      ::dst::log::write(::dst::log::Level::lvl, dst_log_os_.str()); \
    }                                                               \
  } while (0)
