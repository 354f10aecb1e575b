#pragma once
/// \file bpe_tokenizer.hpp
/// Byte-level BPE loaded from a Hugging Face `tokenizer.json` (the format of the
/// `tokenizers` library), producing the same ids as `tokenizers` does: added-token
/// extraction, the pre-tokenizer sequence (Split with Oniguruma-compatible regexes run
/// by PCRE2, Digits, ByteLevel), then BPE merges. What is supported and what is refused
/// is listed in docs/tokenizers.md.

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer/tokenizer.hpp"

namespace dst::data {

/// A byte-level BPE tokenizer. Thread-safe: each thread keeps its own match state and
/// word cache (per thread, for the tokenizer it used last).
class BpeTokenizer final : public Tokenizer {
 public:
  /// Loads `path`. A `tokenizer_config.json` next to it, if any, says which document
  /// markers `add_special` adds when the file's post-processor adds none
  /// (add_bos_token/add_eos_token, as `transformers` does). Throws dst::Error naming the
  /// file and the offending key for unreadable, malformed or unsupported files.
  static std::unique_ptr<BpeTokenizer> from_file(const std::string& path);
  /// Loads from JSON text; `origin` names it in errors; `config_json` is the text of a
  /// tokenizer_config.json or empty.
  static std::unique_ptr<BpeTokenizer> from_json(std::string_view json, const std::string& origin,
                                                 std::string_view config_json = {});
  ~BpeTokenizer() override;
  BpeTokenizer(const BpeTokenizer&) = delete;
  BpeTokenizer& operator=(const BpeTokenizer&) = delete;

  /// Invalid UTF-8 in `text` is first replaced by U+FFFD per maximal ill-formed
  /// subpart (see utf8.hpp); added tokens in the text (special ones included) are
  /// recognised, as `tokenizers` does by default. `add_special` adds the
  /// post-processor's template, or else the markers tokenizer_config.json asks for.
  void encode_into(std::string_view text, std::vector<TokenId>& out,
                   bool add_special = false) const override;
  using Tokenizer::decode;
  /// Vocabulary tokens decode through the byte-level map; added tokens decode to their
  /// text. `skip_special` drops added tokens marked special.
  std::string decode(const TokenId* ids, std::size_t n, bool skip_special = false) const override;
  TokenId vocab_size() const override;
  std::optional<TokenId> bos_id() const override;
  std::optional<TokenId> eos_id() const override;
  bool is_special(TokenId id) const override;
  std::string describe() const override;

  /// The pieces the pre-tokenizer makes of `text` (no added-token extraction, no
  /// UTF-8 repair: `text` must be valid UTF-8), for tests and diagnostics.
  std::vector<std::string> pre_tokenize(std::string_view text) const;
  /// The id of a token given as its raw text (an added token's content, or the bytes a
  /// vocabulary entry stands for), nullopt if there is none.
  std::optional<TokenId> token_id(std::string_view text) const;

 private:
  struct Impl;
  explicit BpeTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Loads a tokenizer by name: "byte" gives the byte-level tokenizer, anything else is a
/// path to a tokenizer.json.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& name_or_path);

}  // namespace dst::data
