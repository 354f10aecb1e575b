// The command line (app/cli.cpp, CLI11): every command's options and spellings, the usage
// errors and their suggestions, and the help generated from the same definitions.
#include <gtest/gtest.h>

#include <cstdlib>
#include <initializer_list>
#include <string>
#include <vector>

#include "cli.hpp"
#include "core/error.hpp"

namespace dst::app {
namespace {

Command parse(std::initializer_list<const char*> args) {
  std::vector<const char*> argv{"dstrain"};
  argv.insert(argv.end(), args.begin(), args.end());
  return parse_command_line(static_cast<int>(argv.size()), argv.data());
}

/// The message of the UsageError `args` give ("" when they parse).
std::string usage_error(std::initializer_list<const char*> args) {
  try {
    parse(args);
  } catch (const DeckError& e) {
    ADD_FAILURE() << "a DeckError, not a usage error: " << e.what();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(CommandLine, CheckTakesItsDeckAndEveryOptionInBothSpellings) {
  const Command c =
      parse({"check", "--set", "training.max_steps=10", "deck.yaml", "--set=model.preset=tiny",
             "--force", "--deck-out", "out.yaml", "--ranks=2048", "--host", "h100", "--log-level",
             "debug", "--init-timeout=12.5"});
  EXPECT_EQ(c.kind, Command::Kind::check);
  EXPECT_EQ(c.check.deck, "deck.yaml");
  ASSERT_EQ(c.check.overrides.size(), 2u);
  EXPECT_EQ(c.check.overrides[0].path, "training.max_steps");
  EXPECT_EQ(c.check.overrides[1].path, "model.preset");
  EXPECT_TRUE(c.check.force);
  EXPECT_EQ(c.check.deck_out, "out.yaml");
  EXPECT_EQ(c.check.plan_ranks, 2048);
  EXPECT_EQ(c.check.host, "h100");
  EXPECT_EQ(c.common.log_level, log::Level::debug);
  EXPECT_DOUBLE_EQ(c.common.init_timeout_s, 12.5);
}

TEST(CommandLine, TrainTakesADeckAndOverridesButNotCheckOptions) {
  const Command c = parse({"train", "inputs/tiny.yaml", "--set", "training.max_steps=3"});
  EXPECT_EQ(c.kind, Command::Kind::train);
  EXPECT_EQ(c.check.deck, "inputs/tiny.yaml");
  ASSERT_EQ(c.check.overrides.size(), 1u);
  EXPECT_FALSE(c.check.force);
  EXPECT_EQ(usage_error({"train", "d.yaml", "--force"}),
            "unknown option '--force' for 'train' (try: dstrain train --help)");
}

TEST(CommandLine, UnknownNamesAreRefusedWithTheNearestKnownOne) {
  EXPECT_EQ(usage_error({"check", "d.yaml", "--frobnicate"}),
            "unknown option '--frobnicate' for 'check' (try: dstrain check --help)");
  EXPECT_EQ(usage_error({"check", "d.yaml", "--forc"}),
            "unknown option '--forc' for 'check' (did you mean '--force'?) (try: dstrain check "
            "--help)");
  EXPECT_EQ(usage_error({"prep", "--out", "d", "--byte", "--shard-mb=4", "--valid-evry=3", "x"}),
            "unknown option '--valid-evry=3' for 'prep' (did you mean '--valid-every'?) (try: "
            "dstrain prep --help)");
  EXPECT_EQ(usage_error({"chek", "d.yaml"}),
            "unknown command 'chek' (did you mean 'check'?) (try: dstrain --help)");
  EXPECT_EQ(usage_error({"frobnicate"}), "unknown command 'frobnicate' (try: dstrain --help)");
  EXPECT_EQ(usage_error({"--frobnicate"}), "unknown option '--frobnicate' (try: dstrain --help)");
  EXPECT_EQ(usage_error({"help", "genrate"}),
            "no help for unknown command 'genrate' (did you mean 'generate'?)");
}

TEST(CommandLine, MissingValuesAndExtraArgumentsAreUsageErrors) {
  EXPECT_EQ(usage_error({"check", "d.yaml", "--set"}),
            "check: --set needs a value (try: dstrain check --help)");
  EXPECT_EQ(usage_error({"check"}), "'check' needs a deck file: dstrain check <deck.yaml>");
  EXPECT_EQ(usage_error({"train"}), "'train' needs a deck file: dstrain train <deck.yaml>");
  EXPECT_EQ(usage_error({"check", "a.yaml", "b.yaml"}),
            "'check' takes one deck, got a second: 'b.yaml'");
  EXPECT_EQ(usage_error({"inspect", "a.h5", "b.h5"}),
            "'inspect' takes one checkpoint file, got a second: 'b.h5'");
  EXPECT_EQ(usage_error({"check", "d.yaml", "--ranks", "0"}),
            "--ranks needs a rank count >= 1, got '0'");
  EXPECT_EQ(usage_error({"check", "d.yaml", "--init-timeout", "-1"}),
            "--init-timeout needs a positive number of seconds, got '-1'");
  EXPECT_THROW(parse({"check", "d.yaml", "--log-level", "loud"}), Error);
  // A malformed override is a deck error (exit code 3), not a usage error.
  EXPECT_THROW(parse({"check", "d.yaml", "--set", "no-equals-sign"}), DeckError);
}

TEST(CommandLine, HelpAndVersionInEverySpelling) {
  EXPECT_EQ(parse({}).kind, Command::Kind::help);
  EXPECT_EQ(parse({"--help"}).help_topic, "");
  for (const char* flag : {"-h", "--help"}) {
    const Command c = parse({"generate", "x.h5", flag});
    EXPECT_EQ(c.kind, Command::Kind::help);
    EXPECT_EQ(c.help_topic, "generate");
  }
  const Command h = parse({"help", "prep"});
  EXPECT_EQ(h.kind, Command::Kind::help);
  EXPECT_EQ(h.help_topic, "prep");
  EXPECT_EQ(parse({"help", "tokenize"}).help_topic, "tokenize");
  EXPECT_EQ(parse({"--version"}).kind, Command::Kind::version);
  EXPECT_EQ(parse({"version"}).kind, Command::Kind::version);
}

TEST(CommandLine, PrepOptionsAndTheirChecks) {
  const Command c = parse({"prep",     "-o",         "data/",       "--tokenizer",
                           "tok.json", "--eos",      "<|end|>",     "--format",
                           "jsonl",    "--field",    "body",        "--utf8",
                           "replace",  "--shard-mb", "8",           "--valid-every=10",
                           "--name",   "web",        "--overwrite", "--timeout",
                           "30",       "a",          "b/"});
  const PrepCommandOptions& p = c.prep;
  EXPECT_EQ(c.kind, Command::Kind::prep);
  EXPECT_EQ(p.out_dir, "data/");
  EXPECT_EQ(p.tokenizer, "tok.json");
  EXPECT_EQ(p.eos_token, "<|end|>");
  EXPECT_EQ(p.format, "jsonl");
  EXPECT_EQ(p.field, "body");
  EXPECT_EQ(p.utf8, "replace");
  EXPECT_DOUBLE_EQ(p.shard_mb, 8.0);
  EXPECT_EQ(p.valid_num, 1u);
  EXPECT_EQ(p.valid_den, 10u);
  EXPECT_EQ(p.name, "web");
  EXPECT_TRUE(p.overwrite);
  EXPECT_DOUBLE_EQ(p.timeout_s, 30.0);
  EXPECT_EQ(p.inputs, (std::vector<std::string>{"a", "b/"}));

  const Command s =
      parse({"prep", "--out=d", "--byte", "--separator", "%", "--valid-fraction", "0.25", "-"});
  EXPECT_EQ(s.prep.inputs, std::vector<std::string>{"-"});
  EXPECT_EQ(s.prep.separator, "%");
  EXPECT_EQ(s.prep.utf8, "keep");  // the default of --byte text
  EXPECT_EQ(s.prep.valid_num, 250000u);
  EXPECT_EQ(s.prep.valid_den, 1000000u);

  EXPECT_EQ(usage_error({"prep", "--byte", "x"}), "prep: --out DIR is required");
  EXPECT_EQ(usage_error({"prep", "--out", "d", "--byte"}),
            "prep: no input given (files, directories or - for stdin)");
  EXPECT_EQ(usage_error({"prep", "--out", "d", "x"}),
            "prep: give exactly one of --tokenizer tokenizer.json and --byte");
  EXPECT_EQ(usage_error({"prep", "--out", "d", "--byte", "--format", "csv", "x"}),
            "prep: --format must be text or jsonl, got 'csv'");
  EXPECT_EQ(usage_error({"prep", "--out", "d", "--byte", "--valid-fraction", "0.1", "--valid-every",
                         "3", "x"}),
            "prep: give one of --valid-fraction and --valid-every");
  EXPECT_EQ(usage_error({"prep", "--out", "d", "--byte", "--valid-fraction", "1", "x"}),
            "prep: --valid-fraction needs a number in [0, 1), got '1'");
  EXPECT_EQ(usage_error({"prep", "--out", "d", "--byte", "-", "x"}),
            "prep: '-' (standard input) must be the only input");
  EXPECT_EQ(usage_error({"prep", "--out", "d", "--tokenizer", "t.json", "--utf8", "keep", "x"}),
            "prep: --utf8 keep needs --byte and --format text (JSON text and BPE work on UTF-8)");
  EXPECT_EQ(usage_error({"prep", "--out", "d", "--byte", "--field", "f", "x"}),
            "prep: --field applies to --format jsonl, not text");
  EXPECT_EQ(usage_error({"prep", "--out", "d", "--byte", "--name", "a/b", "x"}),
            "prep: --name is a file name prefix without '/', got 'a/b'");
}

TEST(CommandLine, CheckpointToolsOptions) {
  const Command i = parse({"inspect", "step-3.h5", "--no-verify", "--no-deck"});
  EXPECT_EQ(i.kind, Command::Kind::inspect);
  EXPECT_EQ(i.inspect.checkpoint, "step-3.h5");
  EXPECT_FALSE(i.inspect.verify);
  EXPECT_FALSE(i.inspect.deck);
  EXPECT_TRUE(parse({"inspect", "s.h5", "--no-verify", "--verify"}).inspect.verify);  // last wins
  EXPECT_DOUBLE_EQ(parse({"inspect", "s.h5"}).inspect.timeout_s, 600.0);

  const Command e = parse({"export", "s.h5", "-o", "hf", "--dtype=bf16", "--timeout", "9"});
  EXPECT_EQ(e.kind, Command::Kind::export_);
  EXPECT_EQ(e.export_.out_dir, "hf");
  EXPECT_EQ(e.export_.dtype, "bf16");
  EXPECT_DOUBLE_EQ(e.export_.timeout_s, 9.0);
  EXPECT_EQ(usage_error({"export", "s.h5"}), "export: --out DIR is required");
  EXPECT_EQ(usage_error({"export", "s.h5", "--out", "d", "--dtype", "f16"}),
            "export: --dtype must be f32 or bf16, got 'f16'");
  EXPECT_EQ(usage_error({"export", "--out", "d"}),
            "'export' needs a checkpoint file: dstrain export <step-N.h5>");

  const Command g = parse({"generate", "s.h5", "--prompt", "", "--max-new-tokens", "5",
                           "--temperature", "0.7", "--top-k", "40", "--top-p=0.9", "--seed", "7",
                           "--tokenizer", "t.json", "--ignore-eos", "--json"});
  const GenerateOptions& o = g.generate;
  EXPECT_EQ(g.kind, Command::Kind::generate);
  EXPECT_EQ(o.prompt, "");
  EXPECT_EQ(o.max_new_tokens, 5);
  EXPECT_DOUBLE_EQ(o.temperature, 0.7);
  EXPECT_EQ(o.top_k, 40);
  EXPECT_DOUBLE_EQ(o.top_p, 0.9);
  EXPECT_EQ(o.seed, 7u);
  EXPECT_EQ(o.tokenizer, "t.json");
  EXPECT_TRUE(o.ignore_eos);
  EXPECT_TRUE(o.json);
  EXPECT_EQ(usage_error({"generate", "s.h5"}),
            "generate: --prompt TEXT is required (it may be empty)");
  EXPECT_EQ(usage_error({"generate", "s.h5", "--prompt", "a", "--temperature", "-1"}),
            "generate: --temperature must be >= 0 (0: greedy)");
  EXPECT_EQ(usage_error({"generate", "s.h5", "--prompt", "a", "--max-new-tokens", "0"}),
            "generate: --max-new-tokens needs an integer >= 1, got '0'");
  EXPECT_EQ(usage_error({"generate", "s.h5", "--prompt", "a", "--top-p", "0"}),
            "generate: --top-p must be in (0, 1]");
}

TEST(CommandLine, TokenizeOptions) {
  const Command t = parse({"tokenize", "--tokenizer=tok.json", "--add-special"});
  EXPECT_EQ(t.kind, Command::Kind::tokenize);
  EXPECT_EQ(t.tokenize.tokenizer, "tok.json");
  EXPECT_TRUE(t.tokenize.add_special);
  EXPECT_TRUE(parse({"tokenize", "--byte", "--decode"}).tokenize.decode);
  EXPECT_EQ(usage_error({"tokenize"}), "tokenize: give exactly one of --tokenizer PATH and --byte");
  EXPECT_EQ(usage_error({"tokenize", "--byte", "--decode", "--add-special"}),
            "tokenize: --add-special applies to encoding, not to --decode");
  EXPECT_EQ(usage_error({"tokenize", "--byte", "text"}),
            "'tokenize' takes no arguments, got 'text'");
}

TEST(CommandLine, InitTimeoutFromTheEnvironmentUnlessGiven) {
  ::setenv("DSTRAIN_INIT_TIMEOUT", "45", 1);
  EXPECT_DOUBLE_EQ(parse({"check", "d.yaml"}).common.init_timeout_s, 45.0);
  EXPECT_DOUBLE_EQ(parse({"check", "d.yaml", "--init-timeout", "5"}).common.init_timeout_s, 5.0);
  ::setenv("DSTRAIN_INIT_TIMEOUT", "soon", 1);
  EXPECT_EQ(usage_error({"check", "d.yaml"}),
            "DSTRAIN_INIT_TIMEOUT needs a positive number of seconds, got 'soon'");
  ::unsetenv("DSTRAIN_INIT_TIMEOUT");
}

// The help is generated from the definitions the parser uses: each command's help names
// its usage, every option it parses, the common options and its exit codes.
TEST(CommandLine, HelpOfEachCommandNamesItsOptions) {
  const std::string general = help_text("");
  EXPECT_NE(general.find("usage: dstrain <command> [options]"), std::string::npos) << general;
  for (const char* command : {"check <deck.yaml>", "train <deck.yaml>", "prep --out DIR",
                              "inspect <ckpt.h5>", "export <ckpt.h5>", "generate <ckpt.h5>",
                              "tokenize", "help <command>", "--version", "--log-level"})
    EXPECT_NE(general.find(command), std::string::npos) << command << " in\n" << general;

  const struct {
    const char* topic;
    std::vector<const char*> names;
  } topics[] = {
      {"check", {"--set key=value", "--force", "--deck-out FILE", "--ranks N", "--host KIND"}},
      {"train", {"--set key=value"}},
      {"prep",
       {"-o, --out DIR", "--byte", "--tokenizer FILE", "--eos TOKEN", "--format text|jsonl",
        "--separator LINE", "--field NAME", "--utf8 MODE", "--shard-mb MB", "--valid-fraction F",
        "--valid-every N", "--name NAME", "--overwrite", "--timeout S"}},
      {"inspect", {"--verify, --no-verify", "--no-deck", "--timeout S"}},
      {"export", {"--format safetensors", "-o, --out DIR", "--dtype f32|bf16"}},
      {"generate",
       {"--prompt TEXT", "--max-new-tokens N", "--temperature T", "--top-k K", "--top-p P",
        "--seed S", "--tokenizer FILE", "--ignore-eos", "--json"}},
      {"tokenize", {"--tokenizer PATH", "--byte", "--add-special", "--decode"}},
  };
  for (const auto& t : topics) {
    const std::string help = help_text(t.topic);
    EXPECT_EQ(help.rfind(std::string("usage: dstrain ") + t.topic, 0), 0u) << help;
    EXPECT_NE(help.find("exit codes: 0 ok"), std::string::npos) << help;
    EXPECT_NE(help.find("-h, --help"), std::string::npos) << help;
    if (std::string(t.topic) != "tokenize") {
      EXPECT_NE(help.find("common options:\n  --log-level L"), std::string::npos) << help;
    }
    for (const char* name : t.names)
      EXPECT_NE(help.find(std::string("  ") + name), std::string::npos)
          << name << " in the help of " << t.topic << ":\n"
          << help;
  }
  EXPECT_THROW(help_text("frobnicate"), UsageError);
}

}  // namespace
}  // namespace dst::app
