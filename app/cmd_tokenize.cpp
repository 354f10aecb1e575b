// dstrain tokenize: text on stdin -> token ids on stdout, or back with --decode. Runs
// without MPI or Kokkos: it is a filter for inspecting and preparing data.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "core/error.hpp"
#include "core/exit_codes.hpp"
#include "data/tokenizer/bpe_tokenizer.hpp"
#include "data/tokenizer/byte_tokenizer.hpp"

namespace dst::app {

namespace {

std::string read_stdin() {
  std::string s;
  char buf[1 << 16];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, stdin)) > 0)
    s.append(buf, n);
  if (std::ferror(stdin)) throw Error("tokenize: error reading stdin");
  return s;
}

/// Whitespace-separated decimal ids; anything else is named with its position.
std::vector<data::TokenId> parse_ids(const std::string& text) {
  std::vector<data::TokenId> ids;
  std::size_t i = 0;
  const auto is_space = [](char c) {
    return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\f' || c == '\v';
  };
  while (i < text.size()) {
    if (is_space(text[i])) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < text.size() && !is_space(text[j]))
      ++j;
    const std::string word = text.substr(i, j - i);
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(word.c_str(), &end, 10);
    if (end != word.c_str() + word.size() || errno != 0 || v < 0 ||
        v > std::numeric_limits<data::TokenId>::max())
      throw Error("tokenize --decode: '" + word + "' (id number " + std::to_string(ids.size() + 1) +
                  ") is not a token id");
    ids.push_back(static_cast<data::TokenId>(v));
    i = j;
  }
  return ids;
}

void write_stdout(const std::string& s) {
  if (std::fwrite(s.data(), 1, s.size(), stdout) != s.size() || std::fflush(stdout) != 0)
    throw Error("tokenize: error writing stdout");
}

}  // namespace

int run_tokenize(const TokenizeOptions& o) {
  try {
    const std::unique_ptr<data::Tokenizer> tok =
        o.byte ? data::make_byte_tokenizer()
               : std::unique_ptr<data::Tokenizer>(data::BpeTokenizer::from_file(o.tokenizer));
    const std::string input = read_stdin();
    if (o.decode) {
      write_stdout(tok->decode(parse_ids(input)));
      return kExitOk;
    }
    const std::vector<data::TokenId> ids = tok->encode(input, o.add_special);
    std::string out;
    out.reserve(ids.size() * 6 + 1);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (i != 0) out += ' ';
      out += std::to_string(ids[i]);
    }
    out += '\n';
    write_stdout(out);
    return kExitOk;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dstrain: error: %s\n", e.what());
    return kExitError;
  }
}

}  // namespace dst::app
