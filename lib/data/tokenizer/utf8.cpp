#include "data/tokenizer/utf8.hpp"

namespace dst::data {

namespace {

/// Length of the well-formed prefix of the sequence at `s[i]` when it is ill-formed,
/// 0 when a whole well-formed character starts there (its length goes to `len`).
/// Table 3-7 of the Unicode standard: the second byte's range depends on the lead byte
/// (that excludes overlong forms, surrogates and values above U+10FFFF); later
/// continuation bytes are always 80..BF.
std::size_t ill_formed_prefix(std::string_view s, std::size_t i, std::size_t& len) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    len = 1;
    return 0;
  }
  std::size_t need;                    // continuation bytes
  unsigned char lo = 0x80, hi = 0xBF;  // range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;  // overlong below U+0800
    if (b0 == 0xED) hi = 0x9F;  // surrogates D800..DFFF
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;  // overlong below U+10000
    if (b0 == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return 1;  // 80..C1 (continuation or overlong lead) and F5..FF never start a character
  }
  for (std::size_t k = 1; k <= need; ++k) {
    if (i + k >= s.size()) return k;  // truncated at the end of the input
    const auto b = static_cast<unsigned char>(s[i + k]);
    const bool ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) return k;
  }
  len = need + 1;
  return 0;
}

}  // namespace

std::size_t find_invalid_utf8(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size()) {
    // ASCII dominates most text; skip it without the table.
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    std::size_t len = 0;
    if (ill_formed_prefix(text, i, len) != 0) return i;
    i += len;
  }
  return std::string_view::npos;
}

std::string replace_invalid_utf8(std::string_view text) {
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD
  std::string out;
  out.reserve(text.size() + 8);
  std::size_t i = 0;
  while (i < text.size()) {
    std::size_t len = 0;
    const std::size_t bad = ill_formed_prefix(text, i, len);
    if (bad != 0) {
      out += kReplacement;
      i += bad;
    } else {
      out.append(text, i, len);
      i += len;
    }
  }
  return out;
}

}  // namespace dst::data
