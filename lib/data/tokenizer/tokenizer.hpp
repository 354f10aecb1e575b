#pragma once
/// \file tokenizer.hpp
/// Text <-> token ids. Two implementations share this interface: the byte-level
/// tokenizer of the small presets (byte_tokenizer.hpp) and byte-level BPE loaded from a
/// Hugging Face `tokenizer.json` (bpe_tokenizer.hpp). Encoding and decoding are `const`
/// and safe to call from several threads at once.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dst::data {

/// A token id. int32 because datasets store ids as int32 (docs/dataset.md).
using TokenId = std::int32_t;

/// Text <-> token ids.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  /// Appends the ids of `text` (UTF-8; see docs/tokenizers.md for invalid UTF-8) to
  /// `out`. With `add_special`, the tokenizer's document markers (BOS/EOS, see the
  /// implementation) are added around the text.
  virtual void encode_into(std::string_view text, std::vector<TokenId>& out,
                           bool add_special = false) const = 0;

  /// The ids of `text`.
  std::vector<TokenId> encode(std::string_view text, bool add_special = false) const {
    std::vector<TokenId> out;
    encode_into(text, out, add_special);
    return out;
  }

  /// The bytes `ids` stand for. Special tokens are written as their text unless
  /// `skip_special`. The result is exactly the encoded bytes when `ids` came from
  /// encode() of valid UTF-8; an arbitrary id sequence may cut a UTF-8 character, and
  /// the bytes are returned as they are (no U+FFFD substitution). Throws dst::Error for
  /// an id outside the vocabulary.
  virtual std::string decode(const TokenId* ids, std::size_t n,
                             bool skip_special = false) const = 0;
  std::string decode(const std::vector<TokenId>& ids, bool skip_special = false) const {
    return decode(ids.data(), ids.size(), skip_special);
  }

  /// One more than the largest id (ids may have holes in a tokenizer.json vocabulary).
  virtual TokenId vocab_size() const = 0;
  /// The beginning- and end-of-document tokens, when the tokenizer defines them.
  virtual std::optional<TokenId> bos_id() const = 0;
  virtual std::optional<TokenId> eos_id() const = 0;
  /// Whether `id` is a special (control) token rather than text.
  virtual bool is_special(TokenId id) const = 0;
  /// What the tokenizer is, for logs: "byte" or the tokenizer.json path.
  virtual std::string describe() const = 0;
};

}  // namespace dst::data
