#pragma once
// Command-line parsing of the dstrain executable: a subcommand and a few flags.

#include <optional>
#include <string>
#include <vector>

#include "config/deck.hpp"
#include "core/log.hpp"

namespace dst::app {

struct CommonOptions {
  log::Level log_level = log::Level::info;
  /// Deadline of each start-up step before the deck (and its parallel.init_timeout_s) is
  /// known: MPI start-up, the deck broadcast.
  double init_timeout_s = 300.0;
};

struct CheckOptions {
  std::string deck;
  std::vector<config::Override> overrides;
  bool force = false;    ///< print the plan and exit 0 even if it does not fit in memory
  std::string deck_out;  ///< also write the resolved deck (YAML) to this file
};

struct Command {
  enum class Kind { help, version, check, train } kind = Kind::help;
  std::string help_topic;  ///< for Kind::help: "" (general) or a subcommand
  CommonOptions common;
  CheckOptions check;  ///< check and train: the deck and its overrides
};

/// Parses argv; throws dst::UsageError or dst::DeckError (malformed --set).
Command parse_command_line(int argc, char** argv);

/// The --help text for a topic ("" = general, "check").
std::string help_text(const std::string& topic);

}  // namespace dst::app
