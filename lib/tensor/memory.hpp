#pragma once
/// \file memory.hpp
/// The one allocator and the copies of every buffer the model and the trainer own, for
/// either back end. Host memory: aligned_alloc. CUDA memory (DSTRAIN_ENABLE_CUDA builds):
/// cudaMallocAsync from the device's default stream-ordered pool, whose release threshold
/// is raised once so freed blocks stay in the pool instead of going back to the driver.
/// Buffers are taken once from the config (Arena, ParamStore, the optimizer's moments),
/// never inside a kernel call; the CUDA kernels' own scratch grows from the same pool.
///
/// Copies run in the stream order of the context: a copy into host memory returns once
/// the host may read it; a copy from host memory returns once the source may be reused.

#include <cstddef>
#include <cstdint>

#include "tensor/context.hpp"
#include "tensor/tensor.hpp"

namespace dst::tensor {

/// Where the buffers of a context live: its back end's memory. The Kokkos back end's is
/// host memory here (Serial / OpenMP); a Kokkos device back end would need its own case
/// in this allocator; until then kernels.cpp's device check rejects such buffers by name.
constexpr Device device_of(const ExecContext& ctx) {
  return ctx.backend == Backend::cuda ? Device::cuda : Device::host;
}

/// `bytes` of zero-filled memory on `device` (64-byte aligned on the host, 256 on CUDA),
/// allocated in the order of `stream` (a cudaStream_t; ignored on the host). nullptr for
/// 0 bytes. Throws dst::Error naming `what`, the size and the cause on failure, and for
/// Device::cuda in a build without CUDA.
void* allocate(Device device, std::size_t bytes, void* stream, const char* what);
/// Returns memory from allocate() (nullptr is fine). Never throws.
void release(Device device, void* p, void* stream) noexcept;

/// Copies `bytes` from `src` to `dst`; either may be host or ctx's device memory.
void copy(const ExecContext& ctx, void* dst, const void* src, std::size_t bytes);
/// Sets `bytes` at `p` (ctx's memory) to zero. On the host a range of at least
/// core::kStreamingStoreBytes is written with streaming stores (core/bulk_memory.hpp): it
/// is then in memory, not in cache.
void fill_zero(const ExecContext& ctx, void* p, std::size_t bytes);
/// Waits until everything enqueued on ctx's stream has run (nothing to do on the host).
/// The phase timers call it so a GPU phase is timed when it has run, not when it was
/// enqueued.
void synchronize(const ExecContext& ctx);

/// The whole of `t`, from or into a host buffer of t.bytes() bytes.
void download(const ExecContext& ctx, const Tensor& t, void* host);
void upload(const ExecContext& ctx, const void* host, const Tensor& t);

/// The most bytes of `device` memory the allocator held at once so far (the pool's high-
/// water mark on CUDA); 0 on the host, whose peak is the process's resident set.
std::uint64_t peak_device_bytes(Device device);

}  // namespace dst::tensor
