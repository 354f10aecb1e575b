// tensor_checksum against known answers computed independently with the xxhsum command
// line tool (xxHash 0.8.1): each 1 MiB block of the tensor's bytes written to a file and
// hashed with `xxhsum -H64`, the digests written as u64 little-endian to another file and
// hashed again. The tensor is t[i] = (i mod 1000) * 0.25 - 100, exact in f32.
#include <gtest/gtest.h>

#include <vector>

#include "ckpt/checkpoint.hpp"

namespace {

using dst::ckpt::tensor_checksum;

std::vector<float> pattern(std::size_t n) {
  std::vector<float> t(n);
  for (std::size_t i = 0; i < n; ++i)
    t[i] = static_cast<float>(i % 1000) * 0.25f - 100.0f;
  return t;
}

constexpr std::size_t kBlockFloats = dst::ckpt::kChecksumBlockBytes / sizeof(float);  // 262144

TEST(TensorChecksum, EmptyTensorIsXxh64OfNothing) {
  // No blocks: xxh64 of zero bytes, the published XXH64("") value.
  EXPECT_EQ(tensor_checksum(nullptr, 0), 0xef46db3751d8e999ull);
}

TEST(TensorChecksum, OneElement) {
  const auto t = pattern(1);
  EXPECT_EQ(tensor_checksum(t.data(), t.size()), 0xe0e7c791fe1271f0ull);
}

TEST(TensorChecksum, ExactlyOneBlock) {
  const auto t = pattern(kBlockFloats);
  EXPECT_EQ(tensor_checksum(t.data(), t.size()), 0x481cab300688fa35ull);
}

TEST(TensorChecksum, OneBlockAndOneElement) {
  const auto t = pattern(kBlockFloats + 1);
  EXPECT_EQ(tensor_checksum(t.data(), t.size()), 0x7f4108920ae86482ull);
}

TEST(TensorChecksum, SeveralBlocksWithPartialLast) {
  const auto t = pattern(600000);  // 2 full blocks + 75712 elements
  EXPECT_EQ(tensor_checksum(t.data(), t.size()), 0xcd22eebc01e9ed89ull);
}

TEST(TensorChecksum, EqualsTwoStageDefinition) {
  // The pieces a rank computes (block digests) combine to the same value.
  const auto t = pattern(3 * kBlockFloats + 17);
  std::vector<std::uint64_t> digests;
  for (std::size_t at = 0; at < t.size(); at += kBlockFloats) {
    const std::size_t n = std::min(kBlockFloats, t.size() - at);
    digests.push_back(dst::ckpt::block_digest(t.data() + at, n * sizeof(float)));
  }
  EXPECT_EQ(digests.size(), 4u);
  EXPECT_EQ(dst::ckpt::combine_block_digests(digests), tensor_checksum(t.data(), t.size()));
}

TEST(TensorChecksum, DetectsOneFlippedBit) {
  auto t = pattern(kBlockFloats + 1);
  const auto before = tensor_checksum(t.data(), t.size());
  reinterpret_cast<unsigned char*>(t.data())[kBlockFloats * sizeof(float)] ^= 1;  // last block
  EXPECT_NE(tensor_checksum(t.data(), t.size()), before);
}

}  // namespace
