// core/bulk_memory: the streaming zero and copy write exactly their range, whatever its
// alignment and length (the head before the first whole line, the tail after the last),
// in both store widths, and the size-chosen forms give the same bytes on both sides of
// kStreamingStoreBytes.
#include "core/bulk_memory.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace {

using Zero = std::function<void(void*, std::size_t)>;
using Copy = std::function<void(void*, const void*, std::size_t)>;

// Byte i of pattern k: not zero, and different from every other pattern's at i.
unsigned char pattern(std::size_t i, int k) {
  return static_cast<unsigned char>(((i * 131 + static_cast<std::size_t>(k) * 71) % 255) + 1);
}

// Offsets around a line (the stores' alignment) and lengths around whole lines.
const std::vector<std::size_t> kOffsets = {0, 1, 15, 16, 17, 48, 63};
const std::vector<std::size_t> kLengths = {0, 1, 15, 63, 64, 65, 127, 128, 129, 1000, 4096 + 13};
constexpr std::size_t kGuard = 256;  ///< bytes on either side that must stay untouched

// The first byte at or after p on a 64-byte line: offsets are then offsets from a line.
unsigned char* line_aligned(unsigned char* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  return p + (64 - a % 64) % 64;
}

void expect_zeroes_exactly(const Zero& zero, const std::string& name) {
  for (const std::size_t off : kOffsets)
    for (const std::size_t len : kLengths) {
      std::vector<unsigned char> storage(off + len + 2 * kGuard + 64);
      unsigned char* buf = line_aligned(storage.data());
      const std::size_t n = off + len + 2 * kGuard;
      for (std::size_t i = 0; i < n; ++i)
        buf[i] = pattern(i, 1);
      zero(buf + kGuard + off, len);
      for (std::size_t i = 0; i < n; ++i) {
        const bool inside = i >= kGuard + off && i < kGuard + off + len;
        ASSERT_EQ(buf[i], inside ? 0 : pattern(i, 1))
            << name << ": byte " << i << " of a zeroing of " << len << " bytes at offset " << off;
      }
    }
}

void expect_copies_exactly(const Copy& copy, const std::string& name) {
  for (const std::size_t dst_off : kOffsets)
    for (const std::size_t src_off : {std::size_t{0}, std::size_t{5}, std::size_t{32}})
      for (const std::size_t len : kLengths) {
        std::vector<unsigned char> storage(dst_off + len + 2 * kGuard + 64), src(src_off + len);
        unsigned char* dst = line_aligned(storage.data());
        const std::size_t n = dst_off + len + 2 * kGuard;
        for (std::size_t i = 0; i < n; ++i)
          dst[i] = pattern(i, 1);
        for (std::size_t i = 0; i < src.size(); ++i)
          src[i] = pattern(i, 2);
        copy(dst + kGuard + dst_off, src.data() + src_off, len);
        for (std::size_t i = 0; i < n; ++i) {
          const bool inside = i >= kGuard + dst_off && i < kGuard + dst_off + len;
          ASSERT_EQ(dst[i], inside ? pattern(i - kGuard - dst_off + src_off, 2) : pattern(i, 1))
              << name << ": byte " << i << " of a copy of " << len << " bytes to offset " << dst_off
              << " from offset " << src_off;
        }
      }
}

TEST(BulkMemory, StreamingZeroWritesExactlyItsRange) {
  expect_zeroes_exactly(dst::core::stream_zero, "stream_zero");
  expect_zeroes_exactly(dst::core::detail::stream_zero_16, "stream_zero_16");
  expect_zeroes_exactly(dst::core::zero_bytes, "zero_bytes");
}

TEST(BulkMemory, StreamingCopyWritesExactlyItsRange) {
  expect_copies_exactly(dst::core::stream_copy, "stream_copy");
  expect_copies_exactly(dst::core::detail::stream_copy_16, "stream_copy_16");
  expect_copies_exactly(dst::core::copy_bytes, "copy_bytes");
}

TEST(BulkMemory, EmptyRangesMayBeNull) {
  dst::core::stream_zero(nullptr, 0);
  dst::core::stream_copy(nullptr, nullptr, 0);
  dst::core::zero_bytes(nullptr, 0);
  dst::core::copy_bytes(nullptr, nullptr, 0);
}

// zero_bytes and copy_bytes stream from kStreamingStoreBytes on: the same bytes as below.
TEST(BulkMemory, LargeRangesStreamTheSameBytes) {
  const std::size_t len = dst::core::kStreamingStoreBytes + 77;
  const std::size_t off = 9;  // off a line
  std::vector<unsigned char> src(len + off), dst(len + off + 64);
  for (std::size_t i = 0; i < src.size(); ++i)
    src[i] = pattern(i, 2);
  for (std::size_t i = 0; i < dst.size(); ++i)
    dst[i] = pattern(i, 1);
  dst::core::copy_bytes(dst.data() + off, src.data() + off, len);
  for (std::size_t i = 0; i < dst.size(); ++i) {
    const bool inside = i >= off && i < off + len;
    ASSERT_EQ(dst[i], inside ? pattern(i, 2) : pattern(i, 1)) << "copy: byte " << i;
  }
  dst::core::zero_bytes(dst.data() + off, len);
  for (std::size_t i = 0; i < dst.size(); ++i) {
    const bool inside = i >= off && i < off + len;
    ASSERT_EQ(dst[i], inside ? 0 : pattern(i, 1)) << "zero: byte " << i;
  }
}

}  // namespace
