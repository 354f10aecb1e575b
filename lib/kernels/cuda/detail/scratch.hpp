#pragma once
/// \file scratch.hpp
/// The CUDA back end's one piece of owned memory. Kernels never allocate; what some of them
/// need beyond their arguments (reduction partials, an error flag, the embedding
/// backward's sort buffers) comes from a device scratch block kept per (device, stream),
/// allocated on first use and grown, stream-ordered (cudaFreeAsync + cudaMallocAsync on
/// that stream), only when a call needs more than any call before it: after the first
/// step of a training run the sizes repeat and nothing is allocated again. Each block also
/// has a small pinned host area into which results (a norm, a flag) are copied back.
/// Blocks live until the process ends (never freed: at exit the CUDA context may already
/// be gone). One host thread at a time may use a given stream (the model's rule anyway).
/// Internal to kernels/cuda/.

#include <cuda_runtime_api.h>

#include <cstddef>

namespace dst::kernels::cuda_backend::detail {

/// Bytes of the pinned host area of every block (a few 8-byte results).
inline constexpr std::size_t kHostScratchBytes = 256;

struct Scratch {
  char* device;  ///< at least the bytes asked for, 256-byte aligned, contents undefined
  void* host;    ///< kHostScratchBytes of pinned host memory
};

/// The scratch of (current device, stream), holding at least `device_bytes`. Stream-ordered:
/// use it only for work enqueued on `stream`.
Scratch scratch(cudaStream_t stream, std::size_t device_bytes);

/// Offsets of the pieces of one call's scratch, each 256-byte aligned (the alignment of
/// cudaMalloc, enough for any vector type and for CUB's temporary storage).
class ScratchLayout {
 public:
  /// Reserves `bytes` and returns their offset.
  std::size_t add(std::size_t bytes) {
    const std::size_t offset = bytes_;
    bytes_ += (bytes + kAlign - 1) / kAlign * kAlign;
    return offset;
  }
  std::size_t bytes() const { return bytes_; }

 private:
  static constexpr std::size_t kAlign = 256;
  std::size_t bytes_ = 0;
};

}  // namespace dst::kernels::cuda_backend::detail
