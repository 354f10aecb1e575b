#pragma once
/// \file byte_tokenizer.hpp
/// The byte-level tokenizer of the small presets: each byte of the input is one token
/// (id = byte value), plus the four special ids of data/byte_vocab.hpp (vocab 260).

#include <memory>

#include "data/tokenizer/tokenizer.hpp"

namespace dst::data {

/// Bytes are ids. Any byte string, UTF-8 or not, encodes and decodes back exactly;
/// special-token names in the text ("<|eos|>") are ordinary bytes, so text can never
/// inject a control token. `add_special` wraps the text as one document:
/// kByteBos, the bytes, kByteEos.
class ByteTokenizer final : public Tokenizer {
 public:
  void encode_into(std::string_view text, std::vector<TokenId>& out,
                   bool add_special = false) const override;
  using Tokenizer::decode;
  /// Special ids decode to their names ("<|eos|>") unless `skip_special`.
  std::string decode(const TokenId* ids, std::size_t n, bool skip_special = false) const override;
  TokenId vocab_size() const override;
  std::optional<TokenId> bos_id() const override;
  std::optional<TokenId> eos_id() const override;
  bool is_special(TokenId id) const override;
  std::string describe() const override { return "byte"; }
};

/// A new byte-level tokenizer.
std::unique_ptr<Tokenizer> make_byte_tokenizer();

}  // namespace dst::data
