#define PCRE2_CODE_UNIT_WIDTH 8
#include "data/tokenizer/detail/regex.hpp"

#include <pcre2.h>

#include <algorithm>
#include <utility>

#include "core/error.hpp"

namespace dst::data::detail {

namespace {

// Unicode White_Space, Oniguruma's \s: the separators (Z: Zs, Zl, Zp) plus the
// C0 controls 09..0D and NEL (U+0085).
constexpr std::string_view kSpaceItems = "\\p{Z}\\t\\n\\x0B\\f\\r\\x{85}";
constexpr std::string_view kWordItems = "\\p{L}\\p{M}\\p{N}\\p{Pc}";
constexpr std::string_view kHexItems = "0-9a-fA-F";

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  const int n = pcre2_get_error_message(code, buf, sizeof buf);
  return n < 0 ? "PCRE2 error " + std::to_string(code)
               : std::string(reinterpret_cast<const char*>(buf), static_cast<std::size_t>(n));
}

bool is_hex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

}  // namespace

std::string onig_to_pcre2(std::string_view p, const std::string& what) {
  std::string out;
  out.reserve(p.size() + 32);
  bool in_class = false;
  std::size_t class_start = 0;  // index in `p` just after '[' or "[^"
  for (std::size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      std::string_view items;
      bool negated = false;
      switch (e) {
        case 's':
          items = kSpaceItems;
          break;
        case 'S':
          items = kSpaceItems, negated = true;
          break;
        case 'w':
          items = kWordItems;
          break;
        case 'W':
          items = kWordItems, negated = true;
          break;
        case 'h':
          items = kHexItems;
          break;
        case 'H':
          items = kHexItems, negated = true;
          break;
        default:
          break;
      }
      if (!items.empty()) {
        if (in_class) {
          DST_REQUIRE(!negated, what << ": pattern uses \\" << e
                                     << " inside a character class, which PCRE2 cannot "
                                        "express with Oniguruma's meaning (at offset "
                                     << i << ")");
          out += items;
        } else {
          out += negated ? "[^" : "[";
          out += items;
          out += ']';
        }
        ++i;
        continue;
      }
      if (e == 'u' && i + 5 < p.size() && is_hex(p[i + 2]) && is_hex(p[i + 3]) &&
          is_hex(p[i + 4]) && is_hex(p[i + 5])) {
        out += "\\x{";
        out += p.substr(i + 2, 4);
        out += '}';
        i += 5;
        continue;
      }
      out += c;
      out += e;
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      class_start = i + 1;
      continue;
    }
    if (in_class) {
      if (c == ']' && i != class_start) {
        in_class = false;
      } else if (c == '[' && !(i + 1 < p.size() && p[i + 1] == ':')) {
        DST_REQUIRE(false, what << ": pattern nests a character class (offset " << i
                                << "); Oniguruma and PCRE2 read that differently");
      } else if (c == '&' && i + 1 < p.size() && p[i + 1] == '&') {
        DST_REQUIRE(false, what << ": pattern intersects character classes with && (offset " << i
                                << "), which PCRE2 does not support");
      }
    }
    out += c;
  }
  return out;
}

MatchScratch::MatchScratch() {
  data_ = pcre2_match_data_create(1, nullptr);
  context_ = pcre2_match_context_create(nullptr);
  // The JIT's default 32 KiB stack overflows on long runs matched by patterns with
  // lookahead; 8 MiB covers pieces far beyond any real text line.
  stack_ = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  if (data_ == nullptr || context_ == nullptr || stack_ == nullptr) {
    pcre2_jit_stack_free(stack_);
    pcre2_match_context_free(context_);
    pcre2_match_data_free(data_);
    throw Error("tokenizer: out of memory creating PCRE2 match state");
  }
  pcre2_jit_stack_assign(context_, nullptr, stack_);
}

MatchScratch::~MatchScratch() {
  pcre2_jit_stack_free(stack_);
  pcre2_match_context_free(context_);
  pcre2_match_data_free(data_);
}

Regex::Regex(std::string_view pattern, std::string what) : what_(std::move(what)) {
  pcre2_compile_context* cc = pcre2_compile_context_create(nullptr);
  // `.` and `$` treat only LF as a line end, as Oniguruma's Ruby syntax does.
  pcre2_set_newline(cc, PCRE2_NEWLINE_LF);
  int err = 0;
  PCRE2_SIZE off = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                        PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &err, &off, cc);
  pcre2_compile_context_free(cc);
  DST_REQUIRE(code_ != nullptr, what_ << ": PCRE2 cannot compile pattern \"" << pattern
                                      << "\": " << pcre2_message(err) << " at offset " << off);
  // No JIT on this CPU (or PCRE2 built without it) falls back to the interpreter.
  jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() {
  pcre2_code_free(code_);
}

Regex::Regex(Regex&& other) noexcept
    : code_(std::exchange(other.code_, nullptr)), jit_(other.jit_), what_(std::move(other.what_)) {}

bool Regex::find(std::string_view subject, std::size_t start, std::size_t& begin, std::size_t& end,
                 MatchScratch& scratch) const {
  if (start >= subject.size() && !subject.empty()) return false;
  const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.empty() ? "" : subject.data());
  // Subjects were validated (or repaired) as UTF-8 before pre-tokenization.
  const int rc =
      jit_ ? pcre2_jit_match(code_, s, subject.size(), start, 0, scratch.data(), scratch.context())
           : pcre2_match(code_, s, subject.size(), start, PCRE2_NO_UTF_CHECK, scratch.data(),
                         scratch.context());
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  DST_REQUIRE(rc >= 0, what_ << ": PCRE2 match failed on a " << subject.size()
                             << "-byte piece: " << pcre2_message(rc));
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch.data());
  begin = ov[0];
  end = ov[1];
  return true;
}

namespace {

struct Span {
  std::size_t begin, end;
  bool flag;  // a match (before behaviours); "remove" after
};

std::size_t utf8_char_len(unsigned char b) {
  return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

}  // namespace

void split_by_regex(std::string_view piece, const Regex& re, SplitBehavior behavior, bool invert,
                    MatchScratch& scratch, std::vector<std::string_view>& out) {
  if (piece.empty()) return;
  // The common case, Isolated without invert, emits gaps and matches directly.
  if (behavior == SplitBehavior::kIsolated) {
    std::size_t prev = 0, pos = 0, b = 0, e = 0;
    while (pos <= piece.size() && re.find(piece, pos, b, e, scratch)) {
      if (e == b) {  // empty match: search again one character on
        if (b >= piece.size()) break;
        pos = b + utf8_char_len(static_cast<unsigned char>(piece[b]));
        continue;
      }
      if (b > prev) out.push_back(piece.substr(prev, b - prev));
      out.push_back(piece.substr(b, e - b));
      prev = pos = e;
    }
    if (prev < piece.size()) out.push_back(piece.substr(prev));
    return;  // invert only swaps flags, which Isolated ignores
  }
  // The general case follows tokenizers' normalizer.rs: (span, is_match) list, then the
  // behaviour's fold.
  std::vector<Span> spans;
  {
    std::size_t prev = 0, pos = 0, b = 0, e = 0;
    while (pos <= piece.size() && re.find(piece, pos, b, e, scratch)) {
      if (e == b) {
        if (b >= piece.size()) break;
        pos = b + utf8_char_len(static_cast<unsigned char>(piece[b]));
        continue;
      }
      if (b > prev) spans.push_back({prev, b, invert});
      spans.push_back({b, e, !invert});
      prev = pos = e;
    }
    if (prev < piece.size()) spans.push_back({prev, piece.size(), invert});
  }
  std::vector<Span> res;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      break;
    case SplitBehavior::kRemoved:
      res = spans;  // flag = is_match = remove
      break;
    case SplitBehavior::kContiguous: {
      int prev_match = -1;
      for (const Span& s : spans) {
        if (prev_match == static_cast<int>(s.flag) && !res.empty())
          res.back().end = s.end;
        else
          res.push_back({s.begin, s.end, false});
        prev_match = s.flag;
      }
      break;
    }
    case SplitBehavior::kMergedWithPrevious: {
      bool prev_match = false;
      for (const Span& s : spans) {
        if (s.flag && !prev_match && !res.empty())
          res.back().end = s.end;
        else
          res.push_back({s.begin, s.end, false});
        prev_match = s.flag;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool prev_match = false;
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->flag && !prev_match && !res.empty())
          res.back().begin = it->begin;
        else
          res.push_back({it->begin, it->end, false});
        prev_match = it->flag;
      }
      std::reverse(res.begin(), res.end());
      break;
    }
  }
  for (const Span& s : res)
    if (!s.flag && s.end > s.begin) out.push_back(piece.substr(s.begin, s.end - s.begin));
}

}  // namespace dst::data::detail
