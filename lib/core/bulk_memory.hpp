#pragma once
/// \file bulk_memory.hpp
/// Zeroing and copying host ranges too large to stay in cache until their next reader,
/// with non-temporal (streaming) stores. An ordinary store to a line not in cache first
/// reads the line from memory (to own it) and later writes it back: two memory transfers
/// per line. A streaming store writes whole lines straight to memory: one. For the
/// gradient buffer zeroed before every step and the parameters each rank of a node copies
/// into its peers' buffers after its part of the optimizer step, that is measured in
/// docs/measurements/host-kernels.md ("Streaming stores for the whole-buffer writes").
///
/// Each function here that streams ends with a store fence, so its stores are ordered
/// before any later store of this thread: a flag published after them with release order
/// tells a reader in another process that the data are there.

#include <cstddef>

namespace dst::core {

/// Where streaming pays: ranges of at least this many bytes. Measured on the host of
/// docs/performance.md (2 MiB L2 per core, a shared L3): zeroing or copying the 59-118 MB
/// of `small`'s buffers took 1.6-2.8x less time with streaming stores, and the next reader
/// found the data no slower; `tiny`'s 6.6-13 MB stay in cache, where streaming gained at
/// most 0.1 ms and the next reader, which then read from memory, lost 0.3 ms.
inline constexpr std::size_t kStreamingStoreBytes = std::size_t{32} << 20;

/// Sets `bytes` bytes from `p` to zero: with streaming stores on x86-64 (64-byte ones
/// where the CPU has AVX-512F, 16-byte ones otherwise), with std::memset elsewhere.
void stream_zero(void* p, std::size_t bytes);

/// Copies `bytes` bytes from `src` to `dst` (ranges that do not overlap), storing with
/// streaming stores as stream_zero does; std::memcpy where the CPU has none.
void stream_copy(void* dst, const void* src, std::size_t bytes);

/// stream_zero for ranges of at least kStreamingStoreBytes, std::memset below.
void zero_bytes(void* p, std::size_t bytes);

/// stream_copy for ranges of at least kStreamingStoreBytes, std::memcpy below.
void copy_bytes(void* dst, const void* src, std::size_t bytes);

namespace detail {
/// The forms with 16-byte streaming stores that stream_zero and stream_copy use on an
/// x86-64 CPU without AVX-512F (std::memset and std::memcpy on other CPUs); declared here
/// so that the tests run them on every CPU.
void stream_zero_16(void* p, std::size_t bytes);
void stream_copy_16(void* dst, const void* src, std::size_t bytes);
}  // namespace detail

}  // namespace dst::core
