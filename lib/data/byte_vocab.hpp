#pragma once
/// \file byte_vocab.hpp
/// The byte-level vocabulary of the small presets (vocab_size 260): ids 0..255 are the
/// byte values, then four special tokens. Part of the dataset format (docs/dataset.md):
/// changing an id changes the meaning of every byte-level shard.

#include <cstdint>
#include <optional>
#include <string_view>

namespace dst::data {

inline constexpr std::int32_t kByteVocabSize = 260;
inline constexpr std::int32_t kByteBos = 256;  ///< beginning of a document
inline constexpr std::int32_t kByteEos = 257;  ///< end of a document (separates documents)
inline constexpr std::int32_t kBytePad = 258;  ///< padding (never a target)
inline constexpr std::int32_t kByteUnk = 259;  ///< reserved; never produced by encoding

/// "<|bos|>", "<|eos|>", "<|pad|>", "<|unk|>" for the special ids, nullopt otherwise.
std::optional<std::string_view> byte_special_name(std::int32_t id);
/// The id of a special token's name, nullopt if it is not one.
std::optional<std::int32_t> byte_special_id(std::string_view name);

}  // namespace dst::data
