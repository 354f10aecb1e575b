#include "config/scalar.hpp"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

namespace dst::config::detail {

namespace {

bool all_of(std::string_view s, bool (*pred)(char)) {
  if (s.empty()) return false;
  for (const char c : s)
    if (!pred(c)) return false;
  return true;
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_octal(char c) {
  return c >= '0' && c <= '7';
}
bool is_hex(char c) {
  return std::isxdigit(static_cast<unsigned char>(c)) != 0;
}

std::string_view strip_sign(std::string_view s, bool* negative = nullptr) {
  if (negative != nullptr) *negative = !s.empty() && s[0] == '-';
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) s.remove_prefix(1);
  return s;
}

// Magnitude of a core int; nullopt on overflow or bad syntax.
std::optional<std::uint64_t> magnitude(std::string_view s, bool* negative) {
  *negative = false;
  int base = 10;
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'o' || s[1] == 'x')) {
    base = s[1] == 'o' ? 8 : 16;
    s.remove_prefix(2);
  } else {
    s = strip_sign(s, negative);
  }
  std::uint64_t v = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v, base);
  if (ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

}  // namespace

bool core_int_syntax(std::string_view s) {
  if (s.size() > 2 && s[0] == '0' && s[1] == 'o') return all_of(s.substr(2), is_octal);
  if (s.size() > 2 && s[0] == '0' && s[1] == 'x') return all_of(s.substr(2), is_hex);
  return all_of(strip_sign(s), is_digit);
}

bool core_float_syntax(std::string_view s) {
  if (s == ".nan" || s == ".NaN" || s == ".NAN") return true;
  const std::string_view u = strip_sign(s);
  if (u == ".inf" || u == ".Inf" || u == ".INF") return true;
  // [-+]? ( \. [0-9]+ | [0-9]+ ( \. [0-9]* )? ) ( [eE] [-+]? [0-9]+ )?
  std::size_t i = 0;
  std::size_t int_digits = 0;
  while (i < u.size() && is_digit(u[i]))
    ++i, ++int_digits;
  std::size_t frac_digits = 0;
  if (i < u.size() && u[i] == '.') {
    ++i;
    while (i < u.size() && is_digit(u[i]))
      ++i, ++frac_digits;
  }
  if (int_digits == 0 && frac_digits == 0) return false;
  if (i < u.size() && (u[i] == 'e' || u[i] == 'E')) {
    ++i;
    if (i < u.size() && (u[i] == '+' || u[i] == '-')) ++i;
    std::size_t exp_digits = 0;
    while (i < u.size() && is_digit(u[i]))
      ++i, ++exp_digits;
    if (exp_digits == 0) return false;
  }
  return i == u.size();
}

std::optional<std::int64_t> parse_core_int(std::string_view s) {
  if (!core_int_syntax(s)) return std::nullopt;
  bool negative = false;
  const std::optional<std::uint64_t> m = magnitude(s, &negative);
  if (!m) return std::nullopt;
  constexpr auto kMax = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  if (!negative) {
    if (*m > kMax) return std::nullopt;
    return static_cast<std::int64_t>(*m);
  }
  if (*m > kMax + 1) return std::nullopt;
  if (*m == kMax + 1) return std::numeric_limits<std::int64_t>::min();
  return -static_cast<std::int64_t>(*m);
}

std::optional<std::uint64_t> parse_core_uint(std::string_view s) {
  if (!core_int_syntax(s)) return std::nullopt;
  bool negative = false;
  const std::optional<std::uint64_t> m = magnitude(s, &negative);
  if (!m || negative) return std::nullopt;
  return m;
}

std::optional<bool> parse_core_bool(std::string_view s) {
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  return std::nullopt;
}

bool core_null(std::string_view s) {
  return s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL";
}

std::optional<CoreNumber> parse_core_number(std::string_view s) {
  CoreNumber out;
  const bool is_int = core_int_syntax(s);
  if (!is_int && !core_float_syntax(s)) return std::nullopt;
  if (const std::string_view u = strip_sign(s);
      !is_int && u.size() == 4 && u[0] == '.' && std::isalpha(static_cast<unsigned char>(u[1]))) {
    // .inf / .nan spellings: reported, never turned into a value.
    out.finite = false;
    return out;
  }
  if (is_int && s.size() > 2 && s[0] == '0' && (s[1] == 'o' || s[1] == 'x')) {
    bool negative = false;
    const std::optional<std::uint64_t> m = magnitude(s, &negative);
    if (!m) {
      out.out_of_range = true;
      return out;
    }
    out.value = static_cast<double>(*m);
    return out;
  }
  // Decimal text goes straight to from_chars (locale-independent, correctly rounded), so
  // "-0" keeps its sign and long integers round like floats do.
  std::string_view digits = s;
  if (!digits.empty() && digits[0] == '+') digits.remove_prefix(1);
  const auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), out.value);
  if (ec == std::errc::result_out_of_range) {
    out.out_of_range = true;
    return out;
  }
  if (ec != std::errc() || ptr != digits.data() + digits.size()) return std::nullopt;
  return out;
}

std::string format_number(double v) {
  char buf[64];
  // Integral values below 2^53 (every integer there is exact) print as plain digits:
  // "25", "1000000", not "1e+06".
  constexpr double kExactIntegers = 9007199254740992.0;
  if (std::isfinite(v) && std::nearbyint(v) == v && std::fabs(v) < kExactIntegers &&
      !(v == 0.0 && std::signbit(v))) {
    const auto [ptr, ec] = std::to_chars(buf, buf + sizeof buf, static_cast<std::int64_t>(v));
    if (ec == std::errc()) return std::string(buf, ptr);
  }
  // The fewest significant digits (printf %g style) that read back as exactly `v`:
  // 0.1 -> "0.1", 3e-4 -> "0.0003", 0.1 + 0.2 -> "0.30000000000000004". 17 digits always
  // suffice for a double (max_digits10).
  for (int precision = 1; precision <= std::numeric_limits<double>::max_digits10; ++precision) {
    const auto [ptr, ec] =
        std::to_chars(buf, buf + sizeof buf, v, std::chars_format::general, precision);
    if (ec != std::errc()) break;
    double back = 0.0;
    const auto parsed = std::from_chars(buf, ptr, back);
    if (parsed.ec == std::errc() && (back == v || !std::isfinite(v))) return std::string(buf, ptr);
  }
  const auto [ptr, ec] = std::to_chars(buf, buf + sizeof buf, v);  // shortest round trip
  (void)ec;
  return std::string(buf, ptr);
}

std::string yaml_number(double v) {
  std::string s = format_number(v);
  if (s.find_first_of("n") != std::string::npos) return s;  // inf/nan spellings
  // YAML 1.1 readers (PyYAML, and the many tools built on it) only take a float with a
  // '.' in the mantissa and a signed exponent: write "1.0e-08", never "1e-08", which
  // they would read as a string. to_chars always signs the exponent.
  const auto e = s.find_first_of("eE");
  const auto mantissa_end = e == std::string::npos ? s.size() : e;
  if (s.find('.') == std::string::npos) s.insert(mantissa_end, ".0");
  return s;
}

std::string yaml_string(std::string_view s) {
  const auto plain_char = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || c == '.' || c == '/' ||
           c == '-' || c == '*' || c == '+';
  };
  bool plain = !s.empty() &&
               (std::isalnum(static_cast<unsigned char>(s[0])) != 0 || s[0] == '_' || s[0] == '/');
  for (const char c : s)
    plain = plain && plain_char(c);
  // A plain scalar that resolves to another type would not read back as this string.
  if (plain && (core_null(s) || parse_core_bool(s) || core_int_syntax(s) || core_float_syntax(s)))
    plain = false;
  if (plain) return std::string(s);
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          char esc[8];
          std::snprintf(esc, sizeof esc, "\\x%02x",
                        static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += esc;
        } else {
          out += c;  // UTF-8 passes through unchanged
        }
    }
  }
  return out + "\"";
}

}  // namespace dst::config::detail
