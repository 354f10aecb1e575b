#include "cli.hpp"

#include <cmath>
#include <cstdlib>

#include "core/error.hpp"

namespace dst::app {

namespace {

double parse_seconds(const std::string& flag, const std::string& value) {
  char* end = nullptr;
  const double v = std::strtod(value.c_str(), &end);
  if (end == value.c_str() || *end != '\0' || !(v > 0.0))
    throw UsageError(flag + " needs a positive number of seconds, got '" + value + "'");
  return v;
}

double parse_positive(const std::string& flag, const std::string& value) {
  char* end = nullptr;
  const double v = std::strtod(value.c_str(), &end);
  if (end == value.c_str() || *end != '\0' || !(v > 0.0) || !std::isfinite(v))
    throw UsageError(flag + " needs a positive number, got '" + value + "'");
  return v;
}

/// `dstrain prep` options from args[i..]. Usage errors only: files are checked by prep.
void parse_prep(const std::vector<std::string>& given, std::size_t first, Command& cmd) {
  PrepCommandOptions& p = cmd.prep;
  std::vector<std::string> args;  // --flag=value split into --flag value
  for (std::size_t k = first; k < given.size(); ++k) {
    const std::string& g = given[k];
    const auto eq = g.find('=');
    if (g.compare(0, 2, "--") == 0 && eq != std::string::npos) {
      args.push_back(g.substr(0, eq));
      args.push_back(g.substr(eq + 1));
    } else {
      args.push_back(g);
    }
  }
  std::size_t i = 0;
  auto value_of = [&](const std::string& flag) -> std::string {
    if (i >= args.size()) throw UsageError("prep: " + flag + " needs a value");
    return args[i++];
  };
  bool separator_given = false, field_given = false, valid_given = false;
  while (i < args.size()) {
    const std::string a = args[i++];
    if (a == "-h" || a == "--help") {
      cmd.kind = Command::Kind::help;
      cmd.help_topic = "prep";
      return;
    } else if (a == "--out" || a == "-o") {
      p.out_dir = value_of(a);
    } else if (a == "--tokenizer") {
      p.tokenizer = value_of(a);
    } else if (a == "--byte") {
      p.byte = true;
    } else if (a == "--eos") {
      p.eos_token = value_of(a);
    } else if (a == "--format") {
      p.format = value_of(a);
      if (p.format != "text" && p.format != "jsonl")
        throw UsageError("prep: --format must be text or jsonl, got '" + p.format + "'");
    } else if (a == "--separator") {
      p.separator = value_of(a);
      separator_given = true;
      if (p.separator.find('\n') != std::string::npos || p.separator.empty())
        throw UsageError("prep: --separator is one non-empty line, got '" + p.separator + "'");
    } else if (a == "--field") {
      p.field = value_of(a);
      field_given = true;
    } else if (a == "--utf8") {
      p.utf8 = value_of(a);
      if (p.utf8 != "error" && p.utf8 != "replace" && p.utf8 != "keep")
        throw UsageError("prep: --utf8 must be error, replace or keep, got '" + p.utf8 + "'");
    } else if (a == "--shard-mb") {
      p.shard_mb = parse_positive(a, value_of(a));
    } else if (a == "--valid-fraction") {
      const std::string v = value_of(a);
      char* end = nullptr;
      const double f = std::strtod(v.c_str(), &end);
      if (end == v.c_str() || *end != '\0' || !(f >= 0.0 && f < 1.0))
        throw UsageError("prep: --valid-fraction needs a number in [0, 1), got '" + v + "'");
      if (valid_given) throw UsageError("prep: give one of --valid-fraction and --valid-every");
      valid_given = true;
      // In millionths, so the split is integer arithmetic (data::ValidSplit).
      p.valid_den = 1000000;
      p.valid_num = static_cast<std::uint64_t>(std::llround(f * 1e6));
    } else if (a == "--valid-every") {
      const std::string v = value_of(a);
      char* end = nullptr;
      const long long n = std::strtoll(v.c_str(), &end, 10);
      if (end == v.c_str() || *end != '\0' || n < 2)
        throw UsageError("prep: --valid-every needs an integer >= 2, got '" + v + "'");
      if (valid_given) throw UsageError("prep: give one of --valid-fraction and --valid-every");
      valid_given = true;
      p.valid_num = 1;
      p.valid_den = static_cast<std::uint64_t>(n);
    } else if (a == "--name") {
      p.name = value_of(a);
      if (p.name.empty() || p.name.find('/') != std::string::npos)
        throw UsageError("prep: --name is a file name prefix without '/', got '" + p.name + "'");
    } else if (a == "--overwrite") {
      p.overwrite = true;
    } else if (a == "--timeout") {
      p.timeout_s = parse_seconds(a, value_of(a));
    } else if (a == "--log-level") {
      cmd.common.log_level = log::parse_level(value_of(a));
    } else if (a == "--init-timeout") {
      cmd.common.init_timeout_s = parse_seconds(a, value_of(a));
    } else if (a.size() > 1 && a[0] == '-') {
      throw UsageError("unknown option '" + a + "' for 'prep' (try: dstrain prep --help)");
    } else {
      p.inputs.push_back(a);
    }
  }
  if (p.out_dir.empty()) throw UsageError("prep: --out DIR is required");
  if (p.inputs.empty())
    throw UsageError("prep: no input given (files, directories or - for stdin)");
  if (p.byte == !p.tokenizer.empty())
    throw UsageError("prep: give exactly one of --tokenizer tokenizer.json and --byte");
  if (p.byte && !p.eos_token.empty())
    throw UsageError("prep: --eos applies to --tokenizer (the byte tokenizer's EOS is id 257)");
  std::size_t stdin_count = 0;
  for (const auto& in : p.inputs)
    stdin_count += in == "-";
  if (stdin_count > 0 && p.inputs.size() > 1)
    throw UsageError("prep: '-' (standard input) must be the only input");
  if (p.format == "jsonl" && separator_given)
    throw UsageError("prep: --separator applies to --format text, not jsonl");
  if (p.format == "text" && field_given)
    throw UsageError("prep: --field applies to --format jsonl, not text");
  if (p.utf8 == "keep" && (p.format == "jsonl" || !p.byte))
    throw UsageError(
        "prep: --utf8 keep needs --byte and --format text (JSON text and BPE work on UTF-8)");
  if (p.utf8.empty()) p.utf8 = p.byte && p.format == "text" ? "keep" : "error";
}

}  // namespace

std::string help_text(const std::string& topic) {
  if (topic == "check") {
    return R"(usage: dstrain check <deck.yaml> [--set key=value ...] [--force] [common options]

Validates a run deck, starts the parallel runtime exactly as a training run would
(MPI, node-local ranks, device binding, Kokkos, process groups, a test collective),
and prints the resolved deck and the plan: parameter count, FLOPs per token, memory
per rank, communication per step. Nothing is allocated for the model, so the largest
presets can be checked on a laptop. Launch it with the same mpirun/srun line as the
run to validate the layout too:  mpirun -np 8 dstrain check deck.yaml

options:
  --set key=value     override a deck key (dotted path, YAML value), repeatable:
                      --set training.max_steps=10 --set training.optimizer.betas=[0.9,0.95]
  --force             exit 0 even if the plan needs more memory than a rank has
  --deck-out FILE     also write the resolved deck (YAML) to FILE

exit codes: 0 ok, 2 usage, 3 invalid deck, 4 start-up deadline missed, 5 plan does
not fit in memory (without --force); see docs/exit-codes.md.
)" + help_text("common");
  }
  if (topic == "train") {
    return R"(usage: dstrain train <deck.yaml> [--set key=value ...] [common options]

Trains the model of the deck on its data, data-parallel over the launched ranks:
  mpirun -np 2 dstrain train inputs/tiny.yaml
Rank 0 prints one line per logging.every_steps (loss, learning rate, gradient norm,
tokens/s, MFU, step time, peak memory, ETA) and per-phase timers; the run directory
(run.output_dir) gets the resolved deck (deck.yaml) and the metrics (JSON Lines).
At the end: the final training and validation loss and the bigram baseline of the data.

options:
  --set key=value     override a deck key (dotted path, YAML value), repeatable

exit codes: 0 ok, 2 usage, 3 invalid deck or data, 4 a deadline missed, 6 non-finite
gradients (nan_policy abort) or ranks whose parameters differ; see docs/exit-codes.md.
)" + help_text("common");
  }
  if (topic == "prep") {
    return R"(usage: dstrain prep --out DIR (--byte | --tokenizer tokenizer.json) [options] INPUT...

Tokenizes a corpus into HDF5 token shards (docs/dataset.md), in parallel over the
launched ranks:  mpirun -np 8 dstrain prep --out data/ --byte --separator % corpus/
INPUT: text files, directories (their files, recursively, sorted by name; hidden entries
skipped), or - for standard input (one rank). Documents are dealt round robin to the
ranks; rank r writes DIR/NAME-train-<r>-<k>.h5 (and NAME-valid-...), each shard under a .tmp name
until complete. Rank 0 then writes DIR/NAME-train.manifest (and NAME-valid.manifest):
give the manifest to training as data.train / data.valid. Rank 0 shows the progress and
a summary (documents, tokens, MB/s over all ranks).

options:
  --out DIR             output folder (created)
  --byte                the byte-level tokenizer of the small presets (vocab 260)
  --tokenizer FILE      a Hugging Face tokenizer.json (byte-level BPE); its EOS comes
                        from tokenizer_config.json next to it (eos_token), or --eos
  --eos TOKEN           the end-of-document token's text, e.g. '<|end|>'
  --format text|jsonl   text (default): a file is one document, or see --separator;
                        jsonl: JSON Lines, one object per line, blank lines skipped
  --separator LINE      text: a line equal to LINE ends a document (e.g. %)
  --field NAME          jsonl: the member holding the text (default text)
  --utf8 MODE           invalid UTF-8: error (stop, naming file, line and byte offset),
                        replace (U+FFFD), keep (--byte with text only). Default: keep
                        for --byte text, error otherwise
  --shard-mb MB         close a shard when its tokens reach MB MiB (default 64)
  --valid-fraction F    hold out this fraction of the documents, evenly spread by
                        document index (default 0: none)
  --valid-every N       hold out every N-th document (same as --valid-fraction 1/N)
  --name NAME           file name prefix (default data)
  --overwrite           replace a dataset of the same NAME in DIR
  --timeout S           deadline of each synchronisation of the ranks (default 600)

An input error (unreadable file, malformed JSON line, invalid UTF-8) is reported once,
naming the file, line and byte offset; the shards written so far are removed and no
manifest is written.

exit codes: 0 ok, 1 bad input or failed write, 2 usage, 4 a deadline missed.
)" + help_text("common");
  }
  if (topic == "common") {
    return R"(
common options:
  --log-level L       debug | info | warn | error | off (default info)
  --init-timeout S    deadline in seconds of each start-up step before the deck is
                      read (default 300; then the deck's parallel.init_timeout_s)
  -h, --help          this help
)";
  }
  return R"(usage: dstrain <command> [options]

dstrain pre-trains DeepSeek-architecture language models: one binary, one YAML run
deck, launched with srun/sbatch or mpirun.

commands:
  check <deck.yaml>   validate a deck and print the layout and the plan
  train <deck.yaml>   train the deck's model on its data
  prep --out DIR ...  tokenize a corpus (text, JSON Lines) into HDF5 shards
  tokenize            text on stdin to token ids on stdout (--byte or --tokenizer
                      tokenizer.json; --decode reverses; see dstrain tokenize --help)
  help <command>      help for a command (also: dstrain <command> --help)

  --version           version, git revision, and Kokkos/MPI/HDF5/yaml-cpp versions

Documentation: docs/deck.md (run deck), docs/exit-codes.md, README.md.
)" + help_text("common");
}

Command parse_command_line(int argc, char** argv) {
  Command cmd;
  std::vector<std::string> args(argv + 1, argv + argc);
  if (const char* t = std::getenv("DSTRAIN_INIT_TIMEOUT"))
    cmd.common.init_timeout_s = parse_seconds("DSTRAIN_INIT_TIMEOUT", t);
  if (args.empty()) return cmd;  // general help

  std::size_t i = 0;
  const std::string sub = args[i++];
  if (sub == "--version" || sub == "version") {
    cmd.kind = Command::Kind::version;
    return cmd;
  }
  if (sub == "-h" || sub == "--help") return cmd;
  if (sub == "help") {
    cmd.help_topic = i < args.size() ? args[i] : "";
    if (!cmd.help_topic.empty() && cmd.help_topic != "check" && cmd.help_topic != "train" &&
        cmd.help_topic != "prep")
      throw UsageError("no help for unknown command '" + cmd.help_topic + "'");
    return cmd;
  }
  if (sub == "prep") {
    cmd.kind = Command::Kind::prep;
    parse_prep(args, i, cmd);
    return cmd;
  }
  if (sub != "check" && sub != "train")
    throw UsageError("unknown command '" + sub + "' (try: dstrain --help)");

  cmd.kind = sub == "check" ? Command::Kind::check : Command::Kind::train;
  auto value_of = [&](const std::string& flag) -> std::string {
    if (i >= args.size()) throw UsageError(flag + " needs a value");
    return args[i++];
  };
  while (i < args.size()) {
    const std::string a = args[i++];
    if (a == "-h" || a == "--help") {
      cmd.kind = Command::Kind::help;
      cmd.help_topic = sub;
      return cmd;
    } else if (a == "--set") {
      cmd.check.overrides.push_back(config::parse_override(value_of(a)));
    } else if (a.rfind("--set=", 0) == 0) {
      cmd.check.overrides.push_back(config::parse_override(a.substr(6)));
    } else if (a == "--deck-out" && sub == "check") {
      cmd.check.deck_out = value_of(a);
    } else if (a == "--force" && sub == "check") {
      cmd.check.force = true;
    } else if (a == "--log-level") {
      cmd.common.log_level = log::parse_level(value_of(a));
    } else if (a == "--init-timeout") {
      cmd.common.init_timeout_s = parse_seconds(a, value_of(a));
    } else if (!a.empty() && a[0] == '-') {
      throw UsageError("unknown option '" + a + "' for '" + sub + "' (try: dstrain " + sub +
                       " --help)");
    } else if (cmd.check.deck.empty()) {
      cmd.check.deck = a;
    } else {
      throw UsageError("'" + sub + "' takes one deck, got a second: '" + a + "'");
    }
  }
  if (cmd.check.deck.empty())
    throw UsageError("'check' needs a deck file: dstrain check <deck.yaml>");
  return cmd;
}

}  // namespace dst::app
