#include "core/bulk_memory.hpp"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace dst::core {

#if defined(__x86_64__)
namespace {

constexpr std::size_t kLine = 64;  ///< bytes of a cache line; one loop iteration each

// The 16-byte forms are SSE2, part of every x86-64 CPU.
void lines_zero_16(unsigned char* p, std::size_t lines) {
  const __m128i z = _mm_setzero_si128();
  for (std::size_t i = 0; i < lines; ++i) {
    auto* d = reinterpret_cast<__m128i*>(p + i * kLine);
    _mm_stream_si128(d, z);
    _mm_stream_si128(d + 1, z);
    _mm_stream_si128(d + 2, z);
    _mm_stream_si128(d + 3, z);
  }
}

void lines_copy_16(unsigned char* dst, const unsigned char* src, std::size_t lines) {
  for (std::size_t i = 0; i < lines; ++i) {
    auto* d = reinterpret_cast<__m128i*>(dst + i * kLine);
    const auto* s = reinterpret_cast<const __m128i*>(src + i * kLine);
    _mm_stream_si128(d, _mm_loadu_si128(s));
    _mm_stream_si128(d + 1, _mm_loadu_si128(s + 1));
    _mm_stream_si128(d + 2, _mm_loadu_si128(s + 2));
    _mm_stream_si128(d + 3, _mm_loadu_si128(s + 3));
  }
}

// One 64-byte store per line: about 1.4x faster than four 16-byte ones on the measured
// host (docs/measurements/host-kernels.md). Compiled for AVX-512F by attribute and chosen
// at run time, so every build runs on every x86-64 CPU.
__attribute__((target("avx512f"))) void lines_zero_64(unsigned char* p, std::size_t lines) {
  const __m512i z = _mm512_setzero_si512();
  for (std::size_t i = 0; i < lines; ++i)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(p + i * kLine), z);
}

__attribute__((target("avx512f"))) void lines_copy_64(unsigned char* dst, const unsigned char* src,
                                                      std::size_t lines) {
  for (std::size_t i = 0; i < lines; ++i)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i * kLine),
                        _mm512_loadu_si512(src + i * kLine));
}

bool has_avx512f() {
  static const bool supported = __builtin_cpu_supports("avx512f");
  return supported;
}

/// Bytes from p to the next line boundary (at most `bytes`): the streaming stores start
/// there, aligned, each line written whole.
std::size_t head_bytes(const void* p, std::size_t bytes) {
  const auto misaligned = reinterpret_cast<std::uintptr_t>(p) % kLine;
  const std::size_t head = misaligned == 0 ? 0 : kLine - misaligned;
  return head < bytes ? head : bytes;
}

template <class Lines>
void zero_with(void* p, std::size_t bytes, Lines lines_zero) {
  auto* d = static_cast<unsigned char*>(p);
  const std::size_t head = head_bytes(d, bytes);
  std::memset(d, 0, head);
  const std::size_t lines = (bytes - head) / kLine;
  lines_zero(d + head, lines);
  const std::size_t done = head + lines * kLine;
  std::memset(d + done, 0, bytes - done);
  _mm_sfence();  // streaming stores are weakly ordered: order them before later stores
}

template <class Lines>
void copy_with(void* dst, const void* src, std::size_t bytes, Lines lines_copy) {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  const std::size_t head = head_bytes(d, bytes);
  std::memcpy(d, s, head);
  const std::size_t lines = (bytes - head) / kLine;
  lines_copy(d + head, s + head, lines);
  const std::size_t done = head + lines * kLine;
  std::memcpy(d + done, s + done, bytes - done);
  _mm_sfence();
}

}  // namespace

void stream_zero(void* p, std::size_t bytes) {
  if (bytes == 0) return;
  if (has_avx512f())
    zero_with(p, bytes, lines_zero_64);
  else
    zero_with(p, bytes, lines_zero_16);
}

void stream_copy(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  if (has_avx512f())
    copy_with(dst, src, bytes, lines_copy_64);
  else
    copy_with(dst, src, bytes, lines_copy_16);
}

void detail::stream_zero_16(void* p, std::size_t bytes) {
  if (bytes == 0) return;
  zero_with(p, bytes, lines_zero_16);
}

void detail::stream_copy_16(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  copy_with(dst, src, bytes, lines_copy_16);
}

#else  // no streaming stores known to this build: the C library's

void stream_zero(void* p, std::size_t bytes) {
  std::memset(p, 0, bytes);
}

void stream_copy(void* dst, const void* src, std::size_t bytes) {
  std::memcpy(dst, src, bytes);
}

void detail::stream_zero_16(void* p, std::size_t bytes) {
  std::memset(p, 0, bytes);
}

void detail::stream_copy_16(void* dst, const void* src, std::size_t bytes) {
  std::memcpy(dst, src, bytes);
}

#endif

void zero_bytes(void* p, std::size_t bytes) {
  if (bytes == 0) return;  // p may be null then
  if (bytes >= kStreamingStoreBytes)
    stream_zero(p, bytes);
  else
    std::memset(p, 0, bytes);
}

void copy_bytes(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  if (bytes >= kStreamingStoreBytes)
    stream_copy(dst, src, bytes);
  else
    std::memcpy(dst, src, bytes);
}

}  // namespace dst::core
