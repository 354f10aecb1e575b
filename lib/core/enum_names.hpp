#pragma once
/// \file enum_names.hpp
/// One name table per enumerated setting, so that the text a deck, a log line or a
/// message uses and the value code compares are the same thing, spelled once.
///
/// An enum opts in by specialising EnumNames with its names in enumerator order
/// (the enumerators must be 0, 1, 2, ...):
///
///     enum class Precision : std::uint8_t { fp32, bf16, fp16 };
///     template <>
///     struct EnumNames<Precision> {
///       static constexpr std::array<const char*, 3> names{"fp32", "bf16", "fp16"};
///     };
///
/// then `dst::to_string(Precision::bf16)` is "bf16" and `dst::parse_enum<Precision>("bf16")`
/// is Precision::bf16 (std::nullopt for any other text).

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

namespace dst {

/// Specialise with `static constexpr std::array<const char*, N> names` (see the file comment).
template <class E>
struct EnumNames;

template <class E, class = void>
struct HasEnumNames : std::false_type {};
template <class E>
struct HasEnumNames<E, std::void_t<decltype(EnumNames<E>::names)>> : std::is_enum<E> {};
/// True for the enums that have a name table.
template <class E>
inline constexpr bool has_enum_names_v = HasEnumNames<E>::value;

/// The name of `e`. Throws nothing: a value outside the enumerators (only a cast can make
/// one) reads "<invalid>".
template <class E, std::enable_if_t<has_enum_names_v<E>, int> = 0>
std::string to_string(E e) {
  const auto i = static_cast<std::size_t>(e);
  const auto& names = EnumNames<E>::names;
  return i < names.size() ? names[i] : "<invalid>";
}

/// The enumerator named `text` (exact, case-sensitive), or std::nullopt.
template <class E, std::enable_if_t<has_enum_names_v<E>, int> = 0>
std::optional<E> parse_enum(std::string_view text) {
  const auto& names = EnumNames<E>::names;
  for (std::size_t i = 0; i < names.size(); ++i)
    if (text == names[i]) return static_cast<E>(i);
  return std::nullopt;
}

/// Every name of E in enumerator order, joined by `separator` ("fp32, bf16, fp16").
template <class E, std::enable_if_t<has_enum_names_v<E>, int> = 0>
std::string enum_choices(std::string_view separator = ", ") {
  std::string out;
  for (const char* name : EnumNames<E>::names) {
    if (!out.empty()) out += separator;
    out += name;
  }
  return out;
}

}  // namespace dst
