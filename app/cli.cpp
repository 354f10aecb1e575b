#include "cli.hpp"

#include <cerrno>
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

/// given[first..] with every "--flag=value" split into "--flag", "value".
std::vector<std::string> split_flag_values(const std::vector<std::string>& given,
                                           std::size_t first) {
  std::vector<std::string> args;
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
  return args;
}

/// `dstrain prep` options from args[i..]. Usage errors only: files are checked by prep.
void parse_prep(const std::vector<std::string>& given, std::size_t first, Command& cmd) {
  PrepCommandOptions& p = cmd.prep;
  const std::vector<std::string> args = split_flag_values(given, first);
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

// --- checkpoint tools: inspect, export, generate ---
/// Options of `inspect`, `export`, `generate` from args[first..]: one checkpoint file and
/// the subcommand's flags (--flag value or --flag=value).
void parse_tool(const std::vector<std::string>& given, std::size_t first, const std::string& sub,
                Command& cmd) {
  const std::vector<std::string> args = split_flag_values(given, first);
  std::size_t i = 0;
  auto value_of = [&](const std::string& flag) -> std::string {
    if (i >= args.size()) throw UsageError(sub + ": " + flag + " needs a value");
    return args[i++];
  };
  auto integer = [&](const std::string& flag, long long min) -> long long {
    const std::string v = value_of(flag);
    char* end = nullptr;
    errno = 0;
    const long long n = std::strtoll(v.c_str(), &end, 10);
    if (end == v.c_str() || *end != '\0' || errno != 0 || n < min)
      throw UsageError(sub + ": " + flag + " needs an integer >= " + std::to_string(min) +
                       ", got '" + v + "'");
    return n;
  };
  auto number = [&](const std::string& flag) -> double {
    const std::string v = value_of(flag);
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    if (end == v.c_str() || *end != '\0' || !std::isfinite(x))
      throw UsageError(sub + ": " + flag + " needs a number, got '" + v + "'");
    return x;
  };
  std::string checkpoint;
  double timeout_s = 600.0;
  bool prompt_given = false;
  while (i < args.size()) {
    const std::string a = args[i++];
    if (a == "-h" || a == "--help") {
      cmd.kind = Command::Kind::help;
      cmd.help_topic = sub;
      return;
    } else if (a == "--timeout") {
      timeout_s = parse_seconds(a, value_of(a));
    } else if (a == "--log-level") {
      cmd.common.log_level = log::parse_level(value_of(a));
    } else if (a == "--init-timeout") {
      cmd.common.init_timeout_s = parse_seconds(a, value_of(a));
    } else if (sub == "inspect" && a == "--verify") {
      cmd.inspect.verify = true;
    } else if (sub == "inspect" && a == "--no-verify") {
      cmd.inspect.verify = false;
    } else if (sub == "inspect" && a == "--no-deck") {
      cmd.inspect.deck = false;
    } else if (sub == "export" && a == "--format") {
      cmd.export_.format = value_of(a);
      if (cmd.export_.format != "safetensors")
        throw UsageError("export: --format must be safetensors, got '" + cmd.export_.format + "'");
    } else if (sub == "export" && (a == "--out" || a == "-o")) {
      cmd.export_.out_dir = value_of(a);
    } else if (sub == "export" && a == "--dtype") {
      cmd.export_.dtype = value_of(a);
      if (cmd.export_.dtype != "f32" && cmd.export_.dtype != "bf16")
        throw UsageError("export: --dtype must be f32 or bf16, got '" + cmd.export_.dtype + "'");
    } else if (sub == "generate" && a == "--prompt") {
      cmd.generate.prompt = value_of(a);
      prompt_given = true;
    } else if (sub == "generate" && a == "--max-new-tokens") {
      cmd.generate.max_new_tokens = integer(a, 1);
    } else if (sub == "generate" && a == "--temperature") {
      cmd.generate.temperature = number(a);
      if (cmd.generate.temperature < 0.0)
        throw UsageError("generate: --temperature must be >= 0 (0: greedy)");
    } else if (sub == "generate" && a == "--top-k") {
      cmd.generate.top_k = integer(a, 0);
    } else if (sub == "generate" && a == "--top-p") {
      cmd.generate.top_p = number(a);
      if (!(cmd.generate.top_p > 0.0 && cmd.generate.top_p <= 1.0))
        throw UsageError("generate: --top-p must be in (0, 1]");
    } else if (sub == "generate" && a == "--seed") {
      cmd.generate.seed = static_cast<std::uint64_t>(integer(a, 0));
    } else if (sub == "generate" && a == "--tokenizer") {
      cmd.generate.tokenizer = value_of(a);
    } else if (sub == "generate" && a == "--json") {
      cmd.generate.json = true;
    } else if (sub == "generate" && a == "--ignore-eos") {
      cmd.generate.ignore_eos = true;
    } else if (a.size() > 1 && a[0] == '-') {
      throw UsageError("unknown option '" + a + "' for '" + sub + "' (try: dstrain " + sub +
                       " --help)");
    } else if (checkpoint.empty()) {
      checkpoint = a;
    } else {
      throw UsageError("'" + sub + "' takes one checkpoint file, got a second: '" + a + "'");
    }
  }
  if (checkpoint.empty())
    throw UsageError("'" + sub + "' needs a checkpoint file: dstrain " + sub + " <step-N.h5>");
  if (sub == "inspect") {
    cmd.kind = Command::Kind::inspect;
    cmd.inspect.checkpoint = checkpoint;
    cmd.inspect.timeout_s = timeout_s;
  } else if (sub == "export") {
    if (cmd.export_.out_dir.empty()) throw UsageError("export: --out DIR is required");
    cmd.kind = Command::Kind::export_;
    cmd.export_.checkpoint = checkpoint;
    cmd.export_.timeout_s = timeout_s;
  } else {
    if (!prompt_given) throw UsageError("generate: --prompt TEXT is required (it may be empty)");
    cmd.kind = Command::Kind::generate;
    cmd.generate.checkpoint = checkpoint;
    cmd.generate.timeout_s = timeout_s;
  }
}
// --- end checkpoint tools ---

}  // namespace

std::string help_text(const std::string& topic) {
  // --- checkpoint tools ---
  if (topic == "inspect") {
    return R"(usage: dstrain inspect <step-N.h5> [--no-verify] [--no-deck] [--timeout S]

Prints a checkpoint's metadata (format version, step, sampler position, samples seen,
optimizer and skipped steps, seed, loss scale, software version, creation time, the
world layout at save time, tokenizer), its tensor table (name, shape, dtype, stored
checksum and, unless --no-verify, the recomputed checksum's status OK/MISMATCH) and the
resolved deck it was trained with. The file is opened as training resumes it: the
manifest beside it (size and whole-file hash) is checked before HDF5 reads a byte.

options:
  --no-verify         do not recompute the per-tensor checksums (faster: the manifest's
                      whole-file hash is still checked)
  --no-deck           do not print the stored deck
  --timeout S         deadline of each collective read (default 600)

exit codes: 0 ok, 2 usage, 8 damaged or unreadable checkpoint (manifest, format or
checksum mismatch; the message names the check and the tensor); see docs/tools.md.
)" + help_text("common");
  }
  if (topic == "export") {
    return R"(usage: dstrain export <step-N.h5> --format safetensors --out DIR [--dtype f32|bf16]

Writes the checkpoint's parameters (not the optimizer moments) for Hugging Face
transformers: DIR/model.safetensors, DIR/config.json (LlamaForCausalLM, or
DeepseekV3/V2ForCausalLM for latent-attention models, from the deck stored in the
checkpoint) and DIR/tokenizer.json when the run used a tokenizer.json.
  AutoModelForCausalLM.from_pretrained(DIR)   loads the result.

options:
  --format safetensors  the only format (default)
  --out DIR             output folder (created; existing files of the same names are
                        replaced)
  --dtype f32|bf16      stored precision (default f32: exactly the trained weights)
  --timeout S           deadline of each collective read (default 600)

exit codes: 0 ok, 1 write failure, 2 usage, 8 damaged checkpoint; see docs/tools.md.
)" + help_text("common");
  }
  if (topic == "generate") {
    return R"(usage: dstrain generate <step-N.h5> --prompt TEXT [options]

Continues TEXT with the checkpoint's model (a key/value cache: the prompt is run once,
then one token at a time) and prints the prompt and its continuation. Decoding is
greedy by default; with --temperature > 0 tokens are sampled (top-k, then top-p) from a
counter-based generator keyed by --seed, so a run is reproducible. Generation stops at
--max-new-tokens, at the tokenizer's end-of-document token, or when prompt and
continuation fill the model's max_seq_len. Text goes to stdout, a summary to stderr.

options:
  --prompt TEXT         the text to continue (may be empty: starts a new document)
  --max-new-tokens N    at most N new tokens (default 64)
  --temperature T       0 (default): greedy; > 0: sample softmax(logits / T)
  --top-k K             sample among the K most likely tokens (default 0: all)
  --top-p P             sample among the smallest most-likely set of mass >= P
                        (default 1: all)
  --seed S              the sampler's seed (default 0)
  --tokenizer FILE      a tokenizer.json to use instead of the checkpoint's
  --ignore-eos          do not stop at the end-of-document token
  --json                print one JSON object (prompt, token ids, text, stop reason)
  --timeout S           deadline of each collective read (default 600)

exit codes: 0 ok, 2 usage, 8 damaged checkpoint; see docs/tools.md.
)" + help_text("common");
  }
  // --- end checkpoint tools ---
  if (topic == "check") {
    return R"(usage: dstrain check <deck.yaml> [--set key=value ...] [--force] [--ranks N]
                     [--host KIND] [common options]

Validates a run deck, starts the parallel runtime exactly as a training run would
(MPI, node-local ranks, device binding, Kokkos, process groups, a test collective),
and prints the resolved deck and the plan: parameter count, FLOPs per token, memory
per rank by kind, communication per step by collective, and a predicted step time
from the rate table of docs/performance.md. Nothing is allocated for the model, so the largest
presets can be checked on a laptop. Launch it with the same mpirun/srun line as the
run to validate the layout too:  mpirun -np 8 dstrain check deck.yaml

options:
  --set key=value     override a deck key (dotted path, YAML value), repeatable:
                      --set training.max_steps=10 --set training.optimizer.betas=[0.9,0.95]
  --force             exit 0 even if the plan needs more memory than a rank has
  --deck-out FILE     also write the resolved deck (YAML) to FILE
  --ranks N           plan for N ranks (a cluster layout, from one process) instead of
                      the launched ones; the memory check then uses --host's device
  --host KIND         the rate table's row that predicts the step time: cpu, cpu-mpi,
                      h100, h200 (default: h100/h200 by the GPU's name, else cpu or
                      cpu-mpi by the gradient back end; docs/performance.md)

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
  inspect <ckpt.h5>   a checkpoint's metadata, tensors (checksums verified), deck
  export <ckpt.h5>    parameters as safetensors + Hugging Face config.json (--out DIR)
  generate <ckpt.h5>  continue a --prompt with the checkpoint's model
  tokenize            text on stdin to token ids on stdout (--byte or --tokenizer
                      tokenizer.json; --decode reverses; see dstrain tokenize --help)
  help <command>      help for a command (also: dstrain <command> --help)

  --version           version, git revision, and Kokkos/MPI/HDF5/yaml-cpp versions

Documentation: docs/deck.md (run deck), docs/tools.md (checkpoint tools),
docs/exit-codes.md, README.md.
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
        cmd.help_topic != "prep" && cmd.help_topic != "inspect" && cmd.help_topic != "export" &&
        cmd.help_topic != "generate")
      throw UsageError("no help for unknown command '" + cmd.help_topic + "'");
    return cmd;
  }
  if (sub == "prep") {
    cmd.kind = Command::Kind::prep;
    parse_prep(args, i, cmd);
    return cmd;
  }
  if (sub == "inspect" || sub == "export" || sub == "generate") {  // checkpoint tools
    parse_tool(args, i, sub, cmd);
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
    } else if (a == "--ranks" && sub == "check") {
      const std::string v = value_of(a);
      char* end = nullptr;
      const long n = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n < 1 || n > (1 << 24))
        throw UsageError("--ranks needs a rank count >= 1, got '" + v + "'");
      cmd.check.plan_ranks = static_cast<int>(n);
    } else if (a == "--host" && sub == "check") {
      cmd.check.host = value_of(a);
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
