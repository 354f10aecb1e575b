#pragma once
/// \file regex.hpp
/// PCRE2 (UTF + UCP, JIT) behind a small interface, plus the translation of the
/// Oniguruma patterns found in Hugging Face tokenizer files (the `tokenizers` library
/// runs them with Oniguruma) into PCRE2 patterns with the same meaning.

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

// PCRE2's opaque types (pcre2.h names them through macros; these are the real names).
struct pcre2_real_code_8;
struct pcre2_real_match_data_8;
struct pcre2_real_match_context_8;
struct pcre2_real_jit_stack_8;

namespace dst::data::detail {

/// `pattern` (Oniguruma syntax, Ruby flavour, as `tokenizers` compiles it) rewritten for
/// PCRE2 where the two disagree:
///  - `\s`, `\S`: Oniguruma's are Unicode White_Space (U+0085 in, U+180E out); PCRE2's
///    UCP `\s` also takes U+180E. Rewritten to an explicit class.
///  - `\h`, `\H`: a hex digit in Oniguruma, horizontal space in PCRE2.
///  - `\w`, `\W`: Oniguruma's word is Letter|Mark|Number|Connector_Punctuation.
///  - `\uHHHH`: Oniguruma's code point escape, `\x{HHHH}` in PCRE2.
/// Constructs PCRE2 cannot express the same way (a negated class escape or a nested
/// class or `&&` inside a character class) throw dst::Error naming `what`.
/// `^`/`$` need no rewrite: the pattern is compiled MULTILINE, which is Ruby's meaning.
std::string onig_to_pcre2(std::string_view pattern, const std::string& what);

/// Per-thread matching state: match data and a JIT stack. Not shared between threads.
class MatchScratch {
 public:
  MatchScratch();
  ~MatchScratch();
  MatchScratch(const MatchScratch&) = delete;
  MatchScratch& operator=(const MatchScratch&) = delete;

  pcre2_real_match_data_8* data() const { return data_; }
  pcre2_real_match_context_8* context() const { return context_; }

 private:
  pcre2_real_match_data_8* data_ = nullptr;
  pcre2_real_match_context_8* context_ = nullptr;
  pcre2_real_jit_stack_8* stack_ = nullptr;
};

/// A compiled pattern (UTF, UCP, MULTILINE, newline LF; JIT-compiled when PCRE2 has a
/// JIT for this machine). Subjects must be valid UTF-8: matching skips the UTF check.
class Regex {
 public:
  /// Compiles `pcre2_pattern`; a bad pattern throws dst::Error naming `what`, the PCRE2
  /// message and the offset.
  Regex(std::string_view pcre2_pattern, std::string what);
  ~Regex();
  Regex(Regex&& other) noexcept;
  Regex& operator=(Regex&&) = delete;
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  /// The first match in `subject` at or after byte `start`: [begin, end). False if none.
  bool find(std::string_view subject, std::size_t start, std::size_t& begin, std::size_t& end,
            MatchScratch& scratch) const;

 private:
  pcre2_real_code_8* code_ = nullptr;
  bool jit_ = false;
  std::string what_;
};

/// How a Split pre-tokenizer treats the matches, as in `tokenizers`'
/// SplitDelimiterBehavior.
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

/// Appends to `out` the non-empty pieces `tokenizers`' NormalizedString::split makes of
/// `piece` with the matches of `re` (flags flipped by `invert`) and `behavior`.
/// An empty match is skipped (the next search starts one character later), as
/// Oniguruma's find_iter does.
void split_by_regex(std::string_view piece, const Regex& re, SplitBehavior behavior, bool invert,
                    MatchScratch& scratch, std::vector<std::string_view>& out);

}  // namespace dst::data::detail
