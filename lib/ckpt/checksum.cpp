/// \file checksum.cpp
/// The per-tensor checksum (docs/checkpoint.md, "checksums").
#include <xxhash.h>

#include <cstring>

#include "ckpt/checkpoint.hpp"

namespace dst::ckpt {

static_assert(sizeof(float) == 4, "f32 tensors");

std::uint64_t block_digest(const void* data, std::uint64_t bytes) {
  return XXH64(data, bytes, 0);
}

std::uint64_t combine_block_digests(const std::vector<std::uint64_t>& digests) {
  // The digests as u64 little-endian bytes: x86-64 and AArch64 Linux are little-endian, so
  // the in-memory array is that byte string (the static_assert below keeps it honest).
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "checksum assumes little-endian");
  return XXH64(digests.data(), digests.size() * sizeof(std::uint64_t), 0);
}

std::uint64_t tensor_checksum(const float* data, std::uint64_t elements) {
  const std::uint64_t bytes = elements * sizeof(float);
  const auto* p = reinterpret_cast<const unsigned char*>(data);
  std::vector<std::uint64_t> digests;
  digests.reserve((bytes + kChecksumBlockBytes - 1) / kChecksumBlockBytes);
  for (std::uint64_t at = 0; at < bytes; at += kChecksumBlockBytes)
    digests.push_back(block_digest(p + at, std::min(kChecksumBlockBytes, bytes - at)));
  return combine_block_digests(digests);
}

}  // namespace dst::ckpt
