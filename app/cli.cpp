#include "cli.hpp"

#include <CLI/CLI.hpp>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <utility>

#include "core/error.hpp"
#include "core/suggest.hpp"

namespace dst::app {

namespace {

// --- values: CLI11 reads every value as text; they are converted here, so that each
// message names the flag and the value ---

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

double parse_number(const std::string& flag, const std::string& value) {
  char* end = nullptr;
  const double x = std::strtod(value.c_str(), &end);
  if (end == value.c_str() || *end != '\0' || !std::isfinite(x))
    throw UsageError(flag + " needs a number, got '" + value + "'");
  return x;
}

long long parse_integer(const std::string& flag, const std::string& value, long long min) {
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(value.c_str(), &end, 10);
  if (end == value.c_str() || *end != '\0' || errno != 0 || n < min)
    throw UsageError(flag + " needs an integer >= " + std::to_string(min) + ", got '" + value +
                     "'");
  return n;
}

// --- help: CLI11 generates each command's help from its definitions below; this
// formatter lays it out as a man page's synopsis reads: the usage line and what the
// command does, its options in two columns, then its exit codes ---

class HelpFormatter : public CLI::Formatter {
 public:
  HelpFormatter() { column_width(24); }

  /// The general help's line for `command`: its arguments and what it does.
  void summary(const std::string& command, std::string arguments, std::string text) {
    summaries_.emplace_back(command + " " + arguments, std::move(text));
  }

  std::string make_help(const CLI::App* app, std::string, CLI::AppFormatMode) const override {
    std::ostringstream out;
    out << app->get_description();
    for (const std::string& group : app->get_groups()) {
      const std::vector<const CLI::Option*> options = app->get_options(
          [&](const CLI::Option* o) { return o->get_group() == group && o->nonpositional(); });
      if (!group.empty() && !options.empty()) out << make_group(group, false, options);
    }
    if (app->get_parent() == nullptr) {
      out << "\ncommands:\n";
      for (const auto& [name, text] : summaries_)
        CLI::detail::format_help(out, name, text, get_column_width());
    }
    if (!app->get_footer().empty()) out << '\n' << app->get_footer() << '\n';
    return out.str();
  }

  /// "-o, --out"; a negated flag without CLI11's "{false}".
  std::string make_option_name(const CLI::Option* opt, bool positional) const override {
    std::string names = CLI::Formatter::make_option_name(opt, positional);
    for (std::size_t at = names.find('{'); at != std::string::npos; at = names.find('{', at))
      names.erase(at, names.find('}', at) + 1 - at);
    for (std::size_t at = names.find(','); at != std::string::npos; at = names.find(',', at + 2))
      names.replace(at, 1, ", ");
    return names;
  }

  std::string make_option_opts(const CLI::Option* opt) const override {
    return opt->get_option_text().empty() ? std::string() : " " + opt->get_option_text();
  }

 private:
  std::vector<std::pair<std::string, std::string>> summaries_;
};

constexpr const char* kOptions = "options";
constexpr const char* kCommon = "common options";

// --- the definitions: one CLI11 app with a subcommand per command. Flags and text values
// are bound to Command's fields; numbers to texts converted after the parse ---

class CommandLine {
 public:
  explicit CommandLine(Command& cmd) : cmd_(cmd) {
    app_.formatter(formatter_);
    app_.set_help_flag("-h,--help", "this help")->group(kOptions);
    app_.allow_extras();  // unknown names are reported after the parse, with a suggestion
    app_.require_subcommand(0, 1);
    app_.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    app_.description(R"(usage: dstrain <command> [options]

dstrain pre-trains DeepSeek-architecture language models: one binary, one YAML run
deck, launched with srun/sbatch or mpirun.
)");
    app_.add_flag("--version", version_,
                  "version, git revision, and Kokkos/MPI/HDF5/yaml-cpp versions\n"
                  "(also: dstrain version)")
        ->group(kOptions);
    app_.footer(
        R"(Every command takes --log-level L (debug | info | warn | error | off; default info),
--init-timeout S (the deadline in seconds of each start-up step before the deck is
read; default 300) and -h, --help.

Documentation: docs/deck.md (run deck), docs/tools.md (checkpoint tools),
docs/exit-codes.md, README.md.)");
    define_check();
    define_train();
    define_prep();
    define_inspect();
    define_export();
    define_generate();
    define_tokenize();
    define_help();
    app_.add_subcommand("version", "")->group("");  // `dstrain --version`, spelt as a command
  }

  /// Parses argv into the Command given to the constructor.
  void parse(int argc, const char* const* argv);

  /// The help of `topic` ("" = the general help).
  std::string help(const std::string& topic) const {
    if (topic.empty()) return app_.help();
    const CLI::App* sub = find(topic);
    if (sub == nullptr) throw UsageError(unknown_command(topic, "no help for unknown command"));
    return sub->help();
  }

 private:
  const CLI::App* find(const std::string& name) const {
    for (const CLI::App* sub : app_.get_subcommands({}))
      if (sub->get_name() == name && !sub->get_group().empty()) return sub;
    return nullptr;
  }

  std::string unknown_command(const std::string& name, const std::string& what) const {
    std::vector<std::string> names;
    for (const CLI::App* sub : app_.get_subcommands({}))
      if (!sub->get_group().empty()) names.push_back(sub->get_name());
    std::string message = what + " '" + name + "'";
    if (const std::optional<std::string> s = core::closest(name, names))
      message += " (did you mean '" + *s + "'?)";
    return message;
  }

  /// A command, listed in the general help as `name arguments` and `summary`.
  CLI::App* command(const std::string& name, const std::string& arguments,
                    const std::string& summary) {
    CLI::App* sub = app_.add_subcommand(name, "")->group("commands");
    formatter_->summary(name, arguments, summary);
    return sub;
  }

  void option(CLI::App* sub, const std::string& names, std::string& into,
              const std::string& value_name, const std::string& description) {
    sub->add_option(names, into, description)->option_text(value_name)->group(kOptions);
  }

  void flag(CLI::App* sub, const std::string& names, bool& into, const std::string& description) {
    sub->add_flag(names, into, description)->group(kOptions);
  }

  /// --log-level, --init-timeout and -h, --help (last: the help's last group).
  void common_options(CLI::App* sub) {
    sub->add_option("--log-level", log_level_, "debug | info | warn | error | off (default info)")
        ->option_text("L")
        ->group(kCommon);
    sub->add_option("--init-timeout", init_timeout_,
                    "deadline in seconds of each start-up step before the deck is\n"
                    "read (default 300; then the deck's parallel.init_timeout_s)")
        ->option_text("S")
        ->group(kCommon);
    sub->set_help_flag("-h,--help", "this help")->group(kCommon);
  }

  /// --timeout S of the commands that read or write files collectively.
  void timeout_option(CLI::App* sub, const std::string& description) {
    option(sub, "--timeout", timeout_, "S", description);
  }

  void set_option(CLI::App* sub, const std::string& description) {
    sub->add_option("--set", sets_, description)
        ->allow_extra_args(false)  // one key=value per --set, each kept
        ->option_text("key=value")
        ->group(kOptions);
  }

  void define_check() {
    CLI::App* sub =
        command("check", "<deck.yaml>", "validate a deck and print the layout and the plan");
    sub->description(R"(usage: dstrain check <deck.yaml> [--set key=value ...] [--force] [--ranks N]
                     [--host KIND] [common options]

Validates a run deck, starts the parallel runtime exactly as a training run would
(MPI, node-local ranks, device binding, Kokkos, process groups, a test collective),
and prints the resolved deck and the plan: parameter count, FLOPs per token, memory
per rank by kind, communication per step by collective, and a predicted step time
from the rate table of docs/performance.md. Nothing is allocated for the model, so the
largest presets can be checked on a laptop. Launch it with the same mpirun/srun line as
the run to validate the layout too:  mpirun -np 8 dstrain check deck.yaml
)");
    sub->add_option("deck", cmd_.check.deck)->group("");
    set_option(sub,
               "override a deck key (dotted path, YAML value), repeatable:\n"
               "--set training.max_steps=10 --set training.optimizer.betas=[0.9,0.95]");
    flag(sub, "--force", cmd_.check.force,
         "exit 0 even if the plan needs more memory than a rank has");
    option(sub, "--deck-out", cmd_.check.deck_out, "FILE",
           "also write the resolved deck (YAML) to FILE");
    option(sub, "--ranks", ranks_, "N",
           "plan for N ranks (a cluster layout, from one process) instead of\n"
           "the launched ones; the memory check then uses --host's device");
    option(sub, "--host", cmd_.check.host, "KIND",
           "the rate table's row that predicts the step time: cpu, cpu-mpi,\n"
           "h100, h200 (default: h100/h200 by the GPU's name, else cpu or\n"
           "cpu-mpi by the gradient back end; docs/performance.md)");
    common_options(sub);
    sub->footer(
        R"(exit codes: 0 ok, 2 usage, 3 invalid deck, 4 start-up deadline missed, 5 plan does
not fit in memory (without --force); see docs/exit-codes.md.)");
  }

  void define_train() {
    CLI::App* sub = command("train", "<deck.yaml>", "train the deck's model on its data");
    sub->description(R"(usage: dstrain train <deck.yaml> [--set key=value ...] [common options]

Trains the model of the deck on its data, data-parallel over the launched ranks:
  mpirun -np 2 dstrain train inputs/tiny.yaml
Rank 0 prints one line per logging.every_steps (loss, learning rate, gradient norm,
tokens/s, MFU, step time, peak memory, ETA) and per-phase timers; the run directory
(run.output_dir) gets the resolved deck (deck.yaml) and the metrics (JSON Lines).
At the end: the final training and validation loss and the bigram baseline of the data.
)");
    sub->add_option("deck", cmd_.check.deck)->group("");
    set_option(sub, "override a deck key (dotted path, YAML value), repeatable");
    common_options(sub);
    sub->footer(
        R"(exit codes: 0 ok, 2 usage, 3 invalid deck or data, 4 a deadline missed, 6 non-finite
gradients (nan_policy abort) or ranks whose parameters differ; see docs/exit-codes.md.)");
  }

  void define_prep() {
    PrepCommandOptions& p = cmd_.prep;
    CLI::App* sub =
        command("prep", "--out DIR ...", "tokenize a corpus (text, JSON Lines) into HDF5 shards");
    sub->description(
        R"(usage: dstrain prep --out DIR (--byte | --tokenizer tokenizer.json) [options] INPUT...

Tokenizes a corpus into HDF5 token shards (docs/dataset.md), in parallel over the
launched ranks:  mpirun -np 8 dstrain prep --out data/ --byte --separator % corpus/
INPUT: text files, directories (their files, recursively, sorted by name; hidden entries
skipped), or - for standard input (one rank). Documents are dealt round robin to the
ranks; rank r writes DIR/NAME-train-<r>-<k>.h5 (and NAME-valid-...), each shard under a
.tmp name until complete. Rank 0 then writes DIR/NAME-train.manifest (and
NAME-valid.manifest): give the manifest to training as data.train / data.valid. Rank 0
shows the progress and a summary (documents, tokens, MB/s over all ranks).
)");
    sub->add_option("inputs", p.inputs)->group("");
    option(sub, "-o,--out", p.out_dir, "DIR", "output folder (created)");
    flag(sub, "--byte", p.byte, "the byte-level tokenizer of the small presets (vocab 260)");
    option(sub, "--tokenizer", p.tokenizer, "FILE",
           "a Hugging Face tokenizer.json (byte-level BPE); its EOS comes\n"
           "from tokenizer_config.json next to it (eos_token), or --eos");
    option(sub, "--eos", p.eos_token, "TOKEN", "the end-of-document token's text, e.g. '<|end|>'");
    option(sub, "--format", p.format, "text|jsonl",
           "text (default): a file is one document, or see --separator;\n"
           "jsonl: JSON Lines, one object per line, blank lines skipped");
    option(sub, "--separator", p.separator, "LINE",
           "text: a line equal to LINE ends a document (e.g. %)");
    option(sub, "--field", p.field, "NAME", "jsonl: the member holding the text (default text)");
    option(sub, "--utf8", p.utf8, "MODE",
           "invalid UTF-8: error (stop, naming file, line and byte offset),\n"
           "replace (U+FFFD), keep (--byte with text only). Default: keep\n"
           "for --byte text, error otherwise");
    option(sub, "--shard-mb", shard_mb_, "MB",
           "close a shard when its tokens reach MB MiB (default 64)");
    option(sub, "--valid-fraction", valid_fraction_, "F",
           "hold out this fraction of the documents, evenly spread by\n"
           "document index (default 0: none)");
    option(sub, "--valid-every", valid_every_, "N",
           "hold out every N-th document (same as --valid-fraction 1/N)");
    option(sub, "--name", p.name, "NAME", "file name prefix (default data)");
    flag(sub, "--overwrite", p.overwrite, "replace a dataset of the same NAME in DIR");
    timeout_option(sub, "deadline of each synchronisation of the ranks (default 600)");
    common_options(sub);
    sub->footer(
        R"(An input error (unreadable file, malformed JSON line, invalid UTF-8) is reported once,
naming the file, line and byte offset; the shards written so far are removed and no
manifest is written.

exit codes: 0 ok, 1 bad input or failed write, 2 usage, 4 a deadline missed.)");
  }

  // --- checkpoint tools ---
  void define_inspect() {
    CLI::App* sub = command("inspect", "<ckpt.h5>",
                            "a checkpoint's metadata, tensors (checksums verified), deck");
    sub->description(R"(usage: dstrain inspect <step-N.h5> [--no-verify] [--no-deck] [--timeout S]

Prints a checkpoint's metadata (format version, step, sampler position, samples seen,
optimizer and skipped steps, seed, loss scale, software version, creation time, the
world layout at save time, tokenizer), its tensor table (name, shape, dtype, stored
checksum and, unless --no-verify, the recomputed checksum's status OK/MISMATCH) and the
resolved deck it was trained with. The file is opened as training resumes it: the
manifest beside it (size and whole-file hash) is checked before HDF5 reads a byte.
)");
    sub->add_option("checkpoint", cmd_.inspect.checkpoint)->group("");
    flag(sub, "--verify,!--no-verify", cmd_.inspect.verify,
         "recompute the per-tensor checksums (the default); --no-verify\n"
         "skips it (faster: the manifest's whole-file hash is still checked)");
    flag(sub, "!--no-deck", cmd_.inspect.deck, "do not print the stored deck");
    timeout_option(sub, "deadline of each collective read (default 600)");
    common_options(sub);
    sub->footer(
        R"(exit codes: 0 ok, 2 usage, 8 damaged or unreadable checkpoint (manifest, format or
checksum mismatch; the message names the check and the tensor); see docs/tools.md.)");
  }

  void define_export() {
    ExportOptions& e = cmd_.export_;
    CLI::App* sub = command("export", "<ckpt.h5>",
                            "parameters as safetensors + Hugging Face config.json (--out DIR)");
    sub->description(
        R"(usage: dstrain export <step-N.h5> --format safetensors --out DIR [--dtype f32|bf16]

Writes the checkpoint's parameters (not the optimizer moments) for Hugging Face
transformers: DIR/model.safetensors, DIR/config.json (LlamaForCausalLM, or
DeepseekV3/V2ForCausalLM for latent-attention models, from the deck stored in the
checkpoint) and DIR/tokenizer.json when the run used a tokenizer.json.
  AutoModelForCausalLM.from_pretrained(DIR)   loads the result.
)");
    sub->add_option("checkpoint", e.checkpoint)->group("");
    option(sub, "--format", e.format, "safetensors", "the only format (default)");
    option(sub, "-o,--out", e.out_dir, "DIR",
           "output folder (created; existing files of the same names are\nreplaced)");
    option(sub, "--dtype", e.dtype, "f32|bf16",
           "stored precision (default f32: exactly the trained weights)");
    timeout_option(sub, "deadline of each collective read (default 600)");
    common_options(sub);
    sub->footer(
        "exit codes: 0 ok, 1 write failure, 2 usage, 8 damaged checkpoint; see docs/tools.md.");
  }

  void define_generate() {
    GenerateOptions& g = cmd_.generate;
    CLI::App* sub =
        command("generate", "<ckpt.h5>", "continue a --prompt with the checkpoint's model");
    sub->description(R"(usage: dstrain generate <step-N.h5> --prompt TEXT [options]

Continues TEXT with the checkpoint's model (a key/value cache: the prompt is run once,
then one token at a time) and prints the prompt and its continuation. Decoding is
greedy by default; with --temperature > 0 tokens are sampled (top-k, then top-p) from a
counter-based generator keyed by --seed, so a run is reproducible. Generation stops at
--max-new-tokens, at the tokenizer's end-of-document token, or when prompt and
continuation fill the model's max_seq_len. Text goes to stdout, a summary to stderr.
)");
    sub->add_option("checkpoint", g.checkpoint)->group("");
    prompt_ = sub->add_option("--prompt", g.prompt,
                              "the text to continue (may be empty: starts a new document)")
                  ->option_text("TEXT")
                  ->group(kOptions);
    option(sub, "--max-new-tokens", max_new_tokens_, "N", "at most N new tokens (default 64)");
    option(sub, "--temperature", temperature_, "T",
           "0 (default): greedy; > 0: sample softmax(logits / T)");
    option(sub, "--top-k", top_k_, "K", "sample among the K most likely tokens (default 0: all)");
    option(sub, "--top-p", top_p_, "P",
           "sample among the smallest most-likely set of mass >= P\n(default 1: all)");
    option(sub, "--seed", seed_, "S", "the sampler's seed (default 0)");
    option(sub, "--tokenizer", g.tokenizer, "FILE",
           "a tokenizer.json to use instead of the checkpoint's");
    flag(sub, "--ignore-eos", g.ignore_eos, "do not stop at the end-of-document token");
    flag(sub, "--json", g.json, "print one JSON object (prompt, token ids, text, stop reason)");
    timeout_option(sub, "deadline of each collective read (default 600)");
    common_options(sub);
    sub->footer("exit codes: 0 ok, 2 usage, 8 damaged checkpoint; see docs/tools.md.");
  }
  // --- end checkpoint tools ---

  void define_tokenize() {
    TokenizeOptions& t = cmd_.tokenize;
    CLI::App* sub = command("tokenize", "",
                            "text on stdin to token ids on stdout (--byte or --tokenizer\n"
                            "tokenizer.json; --decode reverses)");
    sub->description(
        R"(usage: dstrain tokenize (--tokenizer PATH | --byte) [--decode] [--add-special]

Reads UTF-8 text on stdin and writes its token ids to stdout, separated by single
spaces, ending with a newline. The whole input is one text (tokenization depends on
context, so it is not split into lines). It runs without MPI: a filter for inspecting
and preparing data.
)");
    option(sub, "--tokenizer", t.tokenizer, "PATH",
           "a Hugging Face tokenizer.json (byte-level BPE, e.g. DeepSeek-V3);\n"
           "a tokenizer_config.json next to it says what --add-special adds");
    flag(sub, "--byte", t.byte, "the byte-level tokenizer of the small presets (vocab 260)");
    flag(sub, "--add-special", t.add_special,
         "add the tokenizer's document markers (byte: <|bos|> ... <|eos|>)");
    flag(sub, "--decode", t.decode,
         "read whitespace-separated ids on stdin, write the text they stand\n"
         "for (special tokens as their text)");
    sub->set_help_flag("-h,--help", "this help")->group(kOptions);
    sub->footer(R"(Invalid UTF-8 in the input: the byte tokenizer keeps the bytes as they are; BPE
encodes each ill-formed sequence as U+FFFD (see docs/tokenizers.md).

exit codes: 0 ok, 1 unreadable tokenizer or input, 2 usage.)");
  }

  void define_help() {
    CLI::App* sub =
        command("help", "<command>", "help for a command (also: dstrain <command> --help)");
    sub->description(
        "usage: dstrain help [command]\n\nPrints a command's help, or the general "
        "help.\n");
    sub->prefix_command();  // the topic is a command's name, not that command
    sub->set_help_flag("-h,--help", "this help")->group(kOptions);
    sub->footer("");
  }

  /// The options given to `sub` that it does not define, and its positionals beyond the
  /// ones it takes, as usage errors: the first unknown option (with the nearest known
  /// one), else the first extra argument.
  void refuse_extras(const CLI::App* sub, const std::vector<std::string>& extras,
                     const std::string& takes) const {
    const std::string name = sub->get_name();
    for (const std::string& e : extras) {
      if (e.size() < 2 || e[0] != '-') continue;
      std::vector<std::string> known;
      for (const CLI::Option* opt : sub->get_options()) {
        for (const std::string& l : opt->get_lnames())
          known.push_back("--" + l);
        for (const std::string& s : opt->get_snames())
          known.push_back("-" + s);
      }
      const std::string given = e.substr(0, e.find('='));
      std::string message = "unknown option '" + e + "' for '" + name + "'";
      if (const std::optional<std::string> s = core::closest(given, known))
        message += " (did you mean '" + *s + "'?)";
      throw UsageError(message + " (try: dstrain " + name + " --help)");
    }
    if (!extras.empty()) {
      if (takes.empty())
        throw UsageError("'" + name + "' takes no arguments, got '" + extras.front() + "'");
      throw UsageError("'" + name + "' takes one " + takes + ", got a second: '" + extras.front() +
                       "'");
    }
  }

  void finish_check_train(const CLI::App* sub);
  void finish_prep(const CLI::App* sub);
  void finish_tool(const CLI::App* sub);
  void finish_tokenize();

  Command& cmd_;
  CLI::App app_{"", "dstrain"};
  std::shared_ptr<HelpFormatter> formatter_ = std::make_shared<HelpFormatter>();
  bool version_ = false;
  // Values converted after the parse.
  std::vector<std::string> sets_;
  std::string log_level_, init_timeout_, timeout_, ranks_, shard_mb_, valid_fraction_, valid_every_,
      max_new_tokens_, temperature_, top_k_, top_p_, seed_;
  CLI::Option* prompt_ = nullptr;
};

void CommandLine::parse(const int argc, const char* const* argv) {
  try {
    app_.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    cmd_.kind = Command::Kind::help;
    for (const CLI::App* sub : app_.get_subcommands({}))
      if (sub->parsed()) cmd_.help_topic = sub->get_name();
    return;
  } catch (const CLI::ParseError& e) {
    // A value missing after its option ("--out: 1 required TEXT missing"), or CLI11's own
    // checks: the command's name and where to find its help.
    std::string name;
    for (const CLI::App* sub : app_.get_subcommands({}))
      if (sub->parsed()) name = sub->get_name();
    std::string what = e.what();
    if (const std::size_t at = what.find(": 1 required"); at != std::string::npos)
      what = what.substr(0, at) + " needs a value";
    throw UsageError(name.empty() ? what + " (try: dstrain --help)"
                                  : name + ": " + what + " (try: dstrain " + name + " --help)");
  }

  const CLI::App* sub = nullptr;
  for (const CLI::App* s : app_.get_subcommands({}))
    if (s->parsed()) sub = s;
  if (sub == nullptr) {
    const std::vector<std::string> extras = app_.remaining();
    if (!extras.empty()) {
      const std::string& first = extras.front();
      if (first.size() > 1 && first[0] == '-')
        throw UsageError("unknown option '" + first + "' (try: dstrain --help)");
      throw UsageError(unknown_command(first, "unknown command") + " (try: dstrain --help)");
    }
    if (version_) cmd_.kind = Command::Kind::version;
    return;  // no command: the general help
  }
  const std::string name = sub->get_name();
  if (name == "help") {
    const std::vector<std::string> topic = sub->remaining();
    cmd_.kind = Command::Kind::help;
    cmd_.help_topic = topic.empty() ? "" : topic.front();
    if (!cmd_.help_topic.empty() && find(cmd_.help_topic) == nullptr)
      throw UsageError(unknown_command(cmd_.help_topic, "no help for unknown command"));
    return;
  }
  if (name == "version") {
    cmd_.kind = Command::Kind::version;
    return;
  }
  // Arguments after "--" are the app's remaining ones: extras of the command too.
  std::vector<std::string> extras = sub->remaining();
  for (const std::string& e : app_.remaining())
    extras.push_back(e);
  if (!log_level_.empty()) cmd_.common.log_level = log::parse_level(log_level_);
  if (!init_timeout_.empty())
    cmd_.common.init_timeout_s = parse_seconds("--init-timeout", init_timeout_);
  if (name == "check" || name == "train") {
    refuse_extras(sub, extras, "deck");
    finish_check_train(sub);
  } else if (name == "prep") {
    refuse_extras(sub, extras, "");
    finish_prep(sub);
  } else if (name == "tokenize") {
    refuse_extras(sub, extras, "");
    finish_tokenize();
  } else {
    refuse_extras(sub, extras, "checkpoint file");
    finish_tool(sub);
  }
}

void CommandLine::finish_check_train(const CLI::App* sub) {
  const std::string name = sub->get_name();
  cmd_.kind = name == "check" ? Command::Kind::check : Command::Kind::train;
  for (const std::string& s : sets_)
    cmd_.check.overrides.push_back(config::parse_override(s));
  if (!ranks_.empty()) {
    char* end = nullptr;
    const long n = std::strtol(ranks_.c_str(), &end, 10);
    if (*end != '\0' || n < 1 || n > (1 << 24))
      throw UsageError("--ranks needs a rank count >= 1, got '" + ranks_ + "'");
    cmd_.check.plan_ranks = static_cast<int>(n);
  }
  if (cmd_.check.deck.empty())
    throw UsageError("'" + name + "' needs a deck file: dstrain " + name + " <deck.yaml>");
}

void CommandLine::finish_prep(const CLI::App* sub) {
  PrepCommandOptions& p = cmd_.prep;
  cmd_.kind = Command::Kind::prep;
  const auto given = [&](const char* flag) { return sub->get_option(flag)->count() > 0; };
  if (p.format != "text" && p.format != "jsonl")
    throw UsageError("prep: --format must be text or jsonl, got '" + p.format + "'");
  if (given("--separator") && (p.separator.find('\n') != std::string::npos || p.separator.empty()))
    throw UsageError("prep: --separator is one non-empty line, got '" + p.separator + "'");
  if (!p.utf8.empty() && p.utf8 != "error" && p.utf8 != "replace" && p.utf8 != "keep")
    throw UsageError("prep: --utf8 must be error, replace or keep, got '" + p.utf8 + "'");
  if (given("--shard-mb")) p.shard_mb = parse_positive("--shard-mb", shard_mb_);
  if (given("--valid-fraction") && given("--valid-every"))
    throw UsageError("prep: give one of --valid-fraction and --valid-every");
  if (given("--valid-fraction")) {
    char* end = nullptr;
    const double f = std::strtod(valid_fraction_.c_str(), &end);
    if (end == valid_fraction_.c_str() || *end != '\0' || !(f >= 0.0 && f < 1.0))
      throw UsageError("prep: --valid-fraction needs a number in [0, 1), got '" + valid_fraction_ +
                       "'");
    // In millionths, so the split is integer arithmetic (data::ValidSplit).
    p.valid_den = 1000000;
    p.valid_num = static_cast<std::uint64_t>(std::llround(f * 1e6));
  }
  if (given("--valid-every")) {
    char* end = nullptr;
    const long long n = std::strtoll(valid_every_.c_str(), &end, 10);
    if (end == valid_every_.c_str() || *end != '\0' || n < 2)
      throw UsageError("prep: --valid-every needs an integer >= 2, got '" + valid_every_ + "'");
    p.valid_num = 1;
    p.valid_den = static_cast<std::uint64_t>(n);
  }
  if (given("--name") && (p.name.empty() || p.name.find('/') != std::string::npos))
    throw UsageError("prep: --name is a file name prefix without '/', got '" + p.name + "'");
  if (given("--timeout")) p.timeout_s = parse_seconds("--timeout", timeout_);
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
  if (p.format == "jsonl" && given("--separator"))
    throw UsageError("prep: --separator applies to --format text, not jsonl");
  if (p.format == "text" && given("--field"))
    throw UsageError("prep: --field applies to --format jsonl, not text");
  if (p.utf8 == "keep" && (p.format == "jsonl" || !p.byte))
    throw UsageError(
        "prep: --utf8 keep needs --byte and --format text (JSON text and BPE work on UTF-8)");
  if (p.utf8.empty()) p.utf8 = p.byte && p.format == "text" ? "keep" : "error";
}

// --- checkpoint tools ---
void CommandLine::finish_tool(const CLI::App* sub) {
  const std::string name = sub->get_name();
  const auto given = [&](const char* flag) { return sub->get_option(flag)->count() > 0; };
  const double timeout_s = given("--timeout") ? parse_seconds("--timeout", timeout_) : 600.0;
  std::string checkpoint;
  if (name == "inspect") {
    cmd_.kind = Command::Kind::inspect;
    cmd_.inspect.timeout_s = timeout_s;
    checkpoint = cmd_.inspect.checkpoint;
  } else if (name == "export") {
    ExportOptions& e = cmd_.export_;
    cmd_.kind = Command::Kind::export_;
    if (e.format != "safetensors")
      throw UsageError("export: --format must be safetensors, got '" + e.format + "'");
    if (e.dtype != "f32" && e.dtype != "bf16")
      throw UsageError("export: --dtype must be f32 or bf16, got '" + e.dtype + "'");
    e.timeout_s = timeout_s;
    checkpoint = e.checkpoint;
    if (!checkpoint.empty() && e.out_dir.empty()) throw UsageError("export: --out DIR is required");
  } else {
    GenerateOptions& g = cmd_.generate;
    cmd_.kind = Command::Kind::generate;
    const std::string prefix = "generate: ";
    if (given("--max-new-tokens"))
      g.max_new_tokens = parse_integer(prefix + "--max-new-tokens", max_new_tokens_, 1);
    if (given("--temperature")) {
      g.temperature = parse_number(prefix + "--temperature", temperature_);
      if (g.temperature < 0.0) throw UsageError("generate: --temperature must be >= 0 (0: greedy)");
    }
    if (given("--top-k")) g.top_k = parse_integer(prefix + "--top-k", top_k_, 0);
    if (given("--top-p")) {
      g.top_p = parse_number(prefix + "--top-p", top_p_);
      if (!(g.top_p > 0.0 && g.top_p <= 1.0))
        throw UsageError("generate: --top-p must be in (0, 1]");
    }
    if (given("--seed"))
      g.seed = static_cast<std::uint64_t>(parse_integer(prefix + "--seed", seed_, 0));
    g.timeout_s = timeout_s;
    checkpoint = g.checkpoint;
    if (!checkpoint.empty() && prompt_->count() == 0)
      throw UsageError("generate: --prompt TEXT is required (it may be empty)");
  }
  if (checkpoint.empty())
    throw UsageError("'" + name + "' needs a checkpoint file: dstrain " + name + " <step-N.h5>");
}
// --- end checkpoint tools ---

void CommandLine::finish_tokenize() {
  const TokenizeOptions& t = cmd_.tokenize;
  cmd_.kind = Command::Kind::tokenize;
  if (t.byte == !t.tokenizer.empty())
    throw UsageError("tokenize: give exactly one of --tokenizer PATH and --byte");
  if (t.decode && t.add_special)
    throw UsageError("tokenize: --add-special applies to encoding, not to --decode");
}

}  // namespace

std::string help_text(const std::string& topic) {
  Command unused;
  return CommandLine(unused).help(topic);
}

Command parse_command_line(const int argc, const char* const* argv) {
  Command cmd;
  if (const char* t = std::getenv("DSTRAIN_INIT_TIMEOUT"))
    cmd.common.init_timeout_s = parse_seconds("DSTRAIN_INIT_TIMEOUT", t);
  CommandLine(cmd).parse(argc, argv);
  return cmd;
}

}  // namespace dst::app
