/// \file fuzz_tokenizer_json.cpp
/// libFuzzer target: tokenizer.json loading (BpeTokenizer::from_json), then encoding and
/// decoding with what loaded (docs/fuzzing.md).
///
/// Input: the tokenizer.json text, optionally followed by a NUL byte and the text of a
/// tokenizer_config.json (JSON text cannot hold a raw NUL, so the split loses nothing).
///
/// Properties checked, each a crash when violated:
/// - from_json ends normally or throws dst::Error (a JSON parse error, an nlohmann type
///   error, std::out_of_range, ... escaping is a finding);
/// - a loaded tokenizer encodes texts (valid and invalid UTF-8, added tokens, digits,
///   whitespace runs, a slice of the input itself) to ids in [0, vocab_size) that
///   decode without error; bos/eos ids are in the vocabulary; decoding arbitrary ids
///   throws only dst::Error;
/// - ASan/UBSan/LSan and -timeout (a pathological pre-tokenizer regex must not hang).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.hpp"
#include "data/tokenizer/bpe_tokenizer.hpp"
#include "data/tokenizer/utf8.hpp"

namespace {

using dst::data::BpeTokenizer;
using dst::data::TokenId;

[[noreturn]] void property_failed(const char* what, std::string_view text) {
  std::fprintf(stderr, "fuzz_tokenizer_json: property violated: %s (text '%.*s')\n", what,
               static_cast<int>(text.size()), text.data());
  std::abort();
}

// Texts every loaded tokenizer encodes: ASCII words and digits, CJK, the added tokens of
// the seed files, invalid UTF-8 (repaired to U+FFFD), whitespace runs, emoji, empty.
const char* const kTexts[] = {
    "Hello world, 12345 tokens!",
    "\xe4\xb8\x96\xe7\x95\x8c \xe3\x81\x93\xe3\x82\x93\xe3\x81\xab\xe3\x81\xa1\xe3\x81\xaf",
    "<|begin|>doc<|end|><tool>x",
    "bad \xff\xc0\xaf utf8 \xed\xa0\x80 \xf4\x90\x80\x80",
    "  \t\r\n\r\n   x  ",
    "\xf0\x9f\x98\x80\xf0\x9f\x98\x80!",
    "",
};

void encode_and_check(const BpeTokenizer& tok, std::string_view text) {
  const TokenId vocab = tok.vocab_size();
  for (bool add_special : {false, true}) {
    std::vector<TokenId> ids;
    try {
      ids = tok.encode(text, add_special);
    } catch (const dst::Error&) {
      continue;  // e.g. a PCRE2 match limit reached: reported as an error, not a crash
    }
    for (TokenId id : ids)
      if (id < 0 || id >= vocab)
        property_failed("encode produced an id outside the vocabulary", text);
    try {
      (void)tok.decode(ids);
    } catch (const dst::Error&) {
      property_failed("decode refused ids that encode produced", text);
    }
    // No round-trip check: add_prefix_space and Split "Removed" change the text legitimately.
  }
  if (dst::data::find_invalid_utf8(text) == std::string_view::npos) {
    try {
      (void)tok.pre_tokenize(text);
    } catch (const dst::Error&) {
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::size_t nul = input.find('\0');
  const std::string_view json = input.substr(0, nul);
  const std::string_view config =
      nul == std::string_view::npos ? std::string_view{} : input.substr(nul + 1);

  std::unique_ptr<BpeTokenizer> tok;
  try {
    tok = BpeTokenizer::from_json(json, "fuzz/tokenizer.json", config);
  } catch (const dst::Error& e) {
    if (std::getenv("DSTRAIN_FUZZ_VERBOSE") != nullptr)
      std::fprintf(stderr, "refused: %s\n", e.what());
    return 0;
  }
  if (std::getenv("DSTRAIN_FUZZ_VERBOSE") != nullptr)
    std::fprintf(stderr, "loaded: vocab %d\n", static_cast<int>(tok->vocab_size()));
  if (!tok) property_failed("from_json returned null", {});

  const TokenId vocab = tok->vocab_size();
  if (vocab <= 0) property_failed("vocab_size is not positive", {});
  for (auto id : {tok->bos_id(), tok->eos_id()})
    if (id && (*id < 0 || *id >= vocab)) property_failed("bos/eos id outside the vocabulary", {});
  (void)tok->describe();

  for (const char* t : kTexts)
    encode_and_check(*tok, t);
  // Text drawn from the definition itself reaches its own tokens and patterns.
  encode_and_check(*tok, json.substr(json.size() / 2, 96));

  // Arbitrary ids, in and out of range: dst::Error for bad ids, never a crash.
  const TokenId probe[] = {0, 1, vocab - 1, vocab, -1, 2147483647};
  for (TokenId id : probe) {
    try {
      (void)tok->decode(&id, 1, false);
      (void)tok->decode(&id, 1, true);
      (void)tok->is_special(id);
    } catch (const dst::Error&) {
    }
  }
  (void)tok->token_id("<|end|>");
  (void)tok->token_id("a");
  return 0;
}
