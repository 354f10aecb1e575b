#include "cli.hpp"

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
    if (!cmd.help_topic.empty() && cmd.help_topic != "check" && cmd.help_topic != "train")
      throw UsageError("no help for unknown command '" + cmd.help_topic + "'");
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
