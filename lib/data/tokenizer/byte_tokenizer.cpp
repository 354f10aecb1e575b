#include "data/tokenizer/byte_tokenizer.hpp"

#include "core/error.hpp"
#include "data/byte_vocab.hpp"

namespace dst::data {

void ByteTokenizer::encode_into(std::string_view text, std::vector<TokenId>& out,
                                bool add_special) const {
  out.reserve(out.size() + text.size() + (add_special ? 2 : 0));
  if (add_special) out.push_back(kByteBos);
  for (const char c : text)
    out.push_back(static_cast<unsigned char>(c));
  if (add_special) out.push_back(kByteEos);
}

std::string ByteTokenizer::decode(const TokenId* ids, std::size_t n, bool skip_special) const {
  std::string out;
  out.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    const TokenId id = ids[i];
    if (id >= 0 && id < 256) {
      out.push_back(static_cast<char>(static_cast<unsigned char>(id)));
      continue;
    }
    const auto name = byte_special_name(id);
    DST_REQUIRE(name.has_value(), "byte tokenizer: cannot decode id " << id << " at position " << i
                                                                      << " (vocabulary is 0.."
                                                                      << kByteVocabSize - 1 << ")");
    if (!skip_special) out += *name;
  }
  return out;
}

TokenId ByteTokenizer::vocab_size() const {
  return kByteVocabSize;
}
std::optional<TokenId> ByteTokenizer::bos_id() const {
  return kByteBos;
}
std::optional<TokenId> ByteTokenizer::eos_id() const {
  return kByteEos;
}
bool ByteTokenizer::is_special(TokenId id) const {
  return id >= 256 && id < kByteVocabSize;
}

std::unique_ptr<Tokenizer> make_byte_tokenizer() {
  return std::make_unique<ByteTokenizer>();
}

}  // namespace dst::data
