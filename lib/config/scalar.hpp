#pragma once
/// \file scalar.hpp
/// YAML 1.2 core-schema resolution of plain scalars, and the inverse: number and string
/// formatting that reads back to the same value. Internal to dst_config.
///
/// The deck follows the YAML 1.2 core schema (yaml.org/spec/1.2.2, 10.3.2) rather than
/// YAML 1.1: only true/false spell booleans (`yes`, `no`, `on` are strings), and `010` is
/// the decimal 10.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace dst::config::detail {

/// `[-+]?[0-9]+`, `0o[0-7]+` or `0x[0-9a-fA-F]+`.
bool core_int_syntax(std::string_view s);
/// The core float forms, including `.inf`/`.nan` spellings (not the integer forms).
bool core_float_syntax(std::string_view s);
/// An integer in core-int syntax; nullopt if the syntax is wrong or it does not fit.
std::optional<std::int64_t> parse_core_int(std::string_view s);
/// As parse_core_int, for unsigned values (a '-' sign gives nullopt).
std::optional<std::uint64_t> parse_core_uint(std::string_view s);
/// true/True/TRUE/false/False/FALSE.
std::optional<bool> parse_core_bool(std::string_view s);
/// ~, null, Null, NULL or empty.
bool core_null(std::string_view s);

struct CoreNumber {
  double value = 0.0;
  bool finite = true;         ///< false for .inf/.nan spellings (value then unset)
  bool out_of_range = false;  ///< the digits overflow a double
};
/// An int or float in core syntax as a double; nullopt if it is neither.
std::optional<CoreNumber> parse_core_number(std::string_view s);

/// Shortest text that reads back as exactly `v` ("0.1", "3e-04", "10000").
std::string format_number(double v);
/// format_number, with ".0" added to integral values so they read as floats in YAML.
std::string yaml_number(double v);
/// The string as a YAML scalar: plain when that reads back as the same string, else
/// double-quoted with escapes.
std::string yaml_string(std::string_view s);

}  // namespace dst::config::detail
