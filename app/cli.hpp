#pragma once
// The dstrain command line: a subcommand and its options, defined through CLI11 (cli.cpp),
// which also generates each subcommand's --help.

#include <cstdint>
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
  /// Plan for this many ranks instead of the launched ones (0 = the launched world):
  /// the layout of a cluster run, planned from one process.
  int plan_ranks = 0;
  /// The rate table's row for the step time ("" = from the device and the back end).
  std::string host;
};

/// `dstrain prep`: the command line as given (checked for usage errors, not for files).
struct PrepCommandOptions {
  std::vector<std::string> inputs;  ///< files, directories, "-" (stdin)
  std::string out_dir;
  std::string tokenizer;  ///< a tokenizer.json, or empty with `byte`
  bool byte = false;
  std::string eos_token;        ///< BPE: the end-of-document token's text, overriding the file's
  std::string format = "text";  ///< text | jsonl
  std::string separator;        ///< text: a line equal to it ends a document
  std::string field = "text";   ///< jsonl: the member holding the text
  std::string utf8;             ///< error | replace | keep; empty = the format's default
  double shard_mb = 64.0;
  std::uint64_t valid_num = 0;  ///< held-out fraction valid_num / valid_den
  std::uint64_t valid_den = 1;
  std::string name = "data";
  bool overwrite = false;
  double timeout_s = 600.0;
};

// --- checkpoint tools: inspect, export, generate ---
/// `dstrain inspect <ckpt.h5>`.
struct InspectOptions {
  std::string checkpoint;
  bool verify = true;  ///< recompute every tensor's checksum (--no-verify skips it)
  bool deck = true;    ///< print the stored deck (--no-deck skips it)
  double timeout_s = 600.0;
};
/// `dstrain export <ckpt.h5> --format safetensors --out DIR`.
struct ExportOptions {
  std::string checkpoint;
  std::string format = "safetensors";
  std::string out_dir;
  std::string dtype = "f32";  ///< f32 | bf16
  double timeout_s = 600.0;
};
/// `dstrain generate <ckpt.h5> --prompt TEXT ...`.
struct GenerateOptions {
  std::string checkpoint;
  std::string prompt;
  std::int64_t max_new_tokens = 64;
  double temperature = 0.0;  ///< 0: greedy
  std::int64_t top_k = 0;    ///< 0: off
  double top_p = 1.0;        ///< 1: off
  std::uint64_t seed = 0;
  std::string tokenizer;  ///< a tokenizer.json overriding the checkpoint's
  bool json = false;
  bool ignore_eos = false;  ///< keep going past the tokenizer's EOS
  double timeout_s = 600.0;
};
// --- end checkpoint tools ---
/// `dstrain tokenize`: text on stdin to token ids on stdout, or back.
struct TokenizeOptions {
  std::string tokenizer;  ///< a tokenizer.json, or empty with `byte`
  bool byte = false;
  bool decode = false;
  bool add_special = false;
};

struct Command {
  enum class Kind {
    help,
    version,
    check,
    train,
    prep,
    inspect,
    export_,
    generate,
    tokenize
  } kind = Kind::help;
  std::string help_topic;  ///< for Kind::help: "" (general) or a subcommand
  CommonOptions common;
  CheckOptions check;  ///< check and train: the deck and its overrides
  PrepCommandOptions prep;
  InspectOptions inspect;  ///< checkpoint tools
  ExportOptions export_;
  GenerateOptions generate;
  TokenizeOptions tokenize;
};

/// Parses argv; throws dst::UsageError (exit code 2: an unknown command or option, with
/// the nearest known one suggested; a missing or malformed value) or dst::DeckError (exit
/// code 3: a malformed --set).
Command parse_command_line(int argc, const char* const* argv);

/// The --help text of a subcommand ("" = the general help), generated from the same
/// definitions the parser uses. Throws dst::UsageError for an unknown one.
std::string help_text(const std::string& topic);

}  // namespace dst::app
