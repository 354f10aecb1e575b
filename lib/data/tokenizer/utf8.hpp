#pragma once
/// \file utf8.hpp
/// UTF-8 well-formedness (Unicode 15, section 3.9, table 3-7) and the replacement of
/// ill-formed input that the BPE tokenizer applies before pre-tokenization.

#include <cstddef>
#include <string>
#include <string_view>

namespace dst::data {

/// Byte offset of the first byte that does not start or continue a well-formed UTF-8
/// sequence (overlong forms, surrogates and code points above U+10FFFF are ill-formed),
/// or std::string_view::npos when `text` is well-formed.
std::size_t find_invalid_utf8(std::string_view text);

/// `text` with each maximal ill-formed subpart replaced by U+FFFD, the practice the
/// Unicode standard recommends (section 3.9, "U+FFFD Substitution of Maximal
/// Subparts"), and the one Python's `bytes.decode("utf-8", "replace")` and Rust's
/// `String::from_utf8_lossy` follow, so a reference can reproduce our input exactly.
std::string replace_invalid_utf8(std::string_view text);

}  // namespace dst::data
