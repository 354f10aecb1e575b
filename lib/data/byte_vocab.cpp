#include "data/byte_vocab.hpp"

#include <array>
#include <utility>

namespace dst::data {

namespace {
constexpr std::array<std::pair<std::int32_t, std::string_view>, 4> kSpecials{{
    {kByteBos, "<|bos|>"},
    {kByteEos, "<|eos|>"},
    {kBytePad, "<|pad|>"},
    {kByteUnk, "<|unk|>"},
}};
}  // namespace

std::optional<std::string_view> byte_special_name(std::int32_t id) {
  for (const auto& [i, name] : kSpecials)
    if (i == id) return name;
  return std::nullopt;
}

std::optional<std::int32_t> byte_special_id(std::string_view name) {
  for (const auto& [i, n] : kSpecials)
    if (n == name) return i;
  return std::nullopt;
}

}  // namespace dst::data
