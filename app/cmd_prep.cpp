// dstrain prep: a corpus (text files, directories, JSON Lines, stdin) -> HDF5 token
// shards and their manifests, in parallel over the launched ranks (data/prep/prepare.hpp).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include "commands.hpp"
#include "core/error.hpp"
#include "core/exit_codes.hpp"
#include "core/log.hpp"
#include "data/byte_vocab.hpp"
#include "data/prep/prepare.hpp"
#include "data/tokenizer/bpe_tokenizer.hpp"
#include "data/tokenizer/byte_tokenizer.hpp"

namespace dst::app {

namespace {

std::string megabytes(std::uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MB", static_cast<double>(bytes) / 1e6);
  return buf;
}

std::string millions(std::uint64_t n) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f M", static_cast<double>(n) / 1e6);
  return buf;
}

/// Rank 0's progress: a bar redrawn in place on a terminal, otherwise a plain line every
/// few seconds (logs and CI keep every line, so they get few).
class ProgressPrinter {
 public:
  ProgressPrinter() : tty_(::isatty(STDERR_FILENO) == 1 && log::level() <= log::Level::info) {}

  void operator()(const data::PrepProgress& p) {
    // Redraws: 5 per second is smooth and costs nothing. Lines: one per 10 s.
    const double every = tty_ ? 0.2 : 10.0;
    if (p.seconds - last_ < every) return;
    last_ = p.seconds;
    const std::uint64_t docs = p.counts.documents[0] + p.counts.documents[1];
    const std::uint64_t tokens = p.counts.tokens[0] + p.counts.tokens[1];
    const double rate = p.seconds > 0 ? static_cast<double>(p.bytes_scanned) / 1e6 / p.seconds : 0;
    char line[200];
    if (p.total_bytes > 0) {
      const double f =
          std::min(1.0, static_cast<double>(p.bytes_scanned) / static_cast<double>(p.total_bytes));
      std::string bar(24, ' ');
      for (int i = 0; i < static_cast<int>(f * 24.0); ++i)
        bar[static_cast<std::size_t>(i)] = '#';
      std::snprintf(line, sizeof line, "prep: [%s] %3.0f%% %s of %s, %.1f MB/s, %llu documents",
                    bar.c_str(), 100.0 * f, megabytes(p.bytes_scanned).c_str(),
                    megabytes(p.total_bytes).c_str(), rate, static_cast<unsigned long long>(docs));
    } else {
      std::snprintf(line, sizeof line, "prep: %s, %.1f MB/s, %llu documents",
                    megabytes(p.bytes_scanned).c_str(), rate,
                    static_cast<unsigned long long>(docs));
    }
    if (tty_) {
      std::fprintf(stderr, "\r%s, %s tokens ", line, millions(tokens).c_str());
      std::fflush(stderr);
      drawn_ = true;
    } else {
      log::info(std::string(line) + ", " + millions(tokens) + " tokens");
    }
  }

  /// Ends the bar's line so the summary starts on its own.
  void finish() {
    if (drawn_) std::fputc('\n', stderr);
    drawn_ = false;
  }

 private:
  bool tty_;
  bool drawn_ = false;
  double last_ = 0.0;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("prep: cannot read tokenizer '" + path + "'");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

int run_prep(runtime::Runtime& rt, const Command& cmd) {
  const PrepCommandOptions& c = cmd.prep;
  const bool root = rt.rank() == 0;

  // --- the tokenizer: every rank loads it; a file it cannot interpret is reported once
  std::unique_ptr<data::Tokenizer> tokenizer;
  data::PrepTokenizer tok;
  std::string problem;
  try {
    if (c.byte) {
      tokenizer = data::make_byte_tokenizer();
      tok.identity = data::byte_tokenizer_identity();
      tok.eos_id = static_cast<std::uint64_t>(data::kByteEos);
    } else {
      auto bpe = data::BpeTokenizer::from_file(c.tokenizer);
      std::optional<data::TokenId> eos = bpe->eos_id();
      if (!c.eos_token.empty()) {
        eos = bpe->token_id(c.eos_token);
        if (!eos)
          throw Error("prep: --eos '" + c.eos_token + "' is not a token of '" + c.tokenizer + "'");
      }
      if (!eos)
        throw Error("prep: tokenizer '" + c.tokenizer +
                    "' defines no end-of-document (EOS) token (no eos_token in a "
                    "tokenizer_config.json next to it); name one with --eos TOKEN");
      tokenizer = std::move(bpe);
      tok.eos_id = static_cast<std::uint64_t>(*eos);
      // The hash covers the whole definition, so two files that merge differently never
      // pass as the same tokenizer (check_shards_agree).
      tok.identity = {"bpe-" + std::to_string(tokenizer->vocab_size()),
                      data::definition_hash(read_file(c.tokenizer))};
    }
    tok.vocab_size = static_cast<std::uint64_t>(tokenizer->vocab_size());
    tok.tokenizer = tokenizer.get();
  } catch (const Error& e) {
    problem = e.what();
  }
  runtime::agree_or_fail(rt.world(), problem.empty(), problem, kExitError, rt.init_timeout_s(),
                         "tokenizer");

  data::PrepOptions o;
  o.inputs = c.inputs;
  o.input.format = c.format == "jsonl" ? data::InputFormat::jsonl : data::InputFormat::text;
  o.input.separator = c.separator;
  o.input.field = c.field;
  o.input.utf8 = c.utf8 == "replace" ? data::Utf8Policy::replace
                 : c.utf8 == "keep"  ? data::Utf8Policy::keep
                                     : data::Utf8Policy::error;
  o.out_dir = c.out_dir;
  o.name = c.name;
  o.shard_mb = c.shard_mb;
  o.valid = {c.valid_num, c.valid_den};
  o.overwrite = c.overwrite;
  o.timeout_s = c.timeout_s;

  log::info("prep: " + std::to_string(c.inputs.size()) + " input(s) -> " + c.out_dir + "/" +
            c.name + "-*, tokenizer " + tok.identity.name + " (vocab " +
            std::to_string(tok.vocab_size) + ", eos " + std::to_string(tok.eos_id) + "), " +
            std::to_string(rt.size()) + (rt.size() == 1 ? " rank" : " ranks"));
  ProgressPrinter printer;
  data::PrepSummary s;
  try {
    s = data::prepare_dataset(rt.world(), tok, o, [&](const data::PrepProgress& p) { printer(p); });
  } catch (...) {
    if (root) printer.finish();
    throw;
  }
  if (root) printer.finish();

  const auto& n = s.counts;
  log::info("prep: train " + std::to_string(n.documents[0]) + " documents, " +
            millions(n.tokens[0]) + " tokens, " + std::to_string(n.shards[0]) + " shard(s) -> " +
            s.train_manifest);
  if (n.documents[1] > 0)
    log::info("prep: valid " + std::to_string(n.documents[1]) + " documents, " +
              millions(n.tokens[1]) + " tokens, " + std::to_string(n.shards[1]) + " shard(s) -> " +
              s.valid_manifest);
  else
    log::info("prep: valid: none held out (--valid-fraction / --valid-every)");
  char line[200];
  std::snprintf(line, sizeof line,
                "prep: done: %llu documents, %llu tokens, %s in %.2f s = %.1f MB/s (%d rank%s)",
                static_cast<unsigned long long>(n.documents[0] + n.documents[1]),
                static_cast<unsigned long long>(n.tokens[0] + n.tokens[1]),
                megabytes(s.input_bytes).c_str(), s.seconds,
                s.seconds > 0 ? static_cast<double>(s.input_bytes) / 1e6 / s.seconds : 0.0, s.ranks,
                s.ranks == 1 ? "" : "s");
  log::info(line);
  return kExitOk;
}

}  // namespace dst::app
