#include "tensor/memory.hpp"

#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "core/bulk_memory.hpp"
#include "core/error.hpp"

#if DSTRAIN_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace dst::tensor {

namespace {
constexpr std::size_t kHostAlignment = 64;

#if DSTRAIN_HAVE_CUDA
[[noreturn]] void cuda_failed(cudaError_t rc, const std::string& what) {
  throw Error("memory: " + what + ": " + cudaGetErrorName(rc) + " (" + cudaGetErrorString(rc) +
              ")");
}

void check(cudaError_t rc, const char* call) {
  if (rc != cudaSuccess) cuda_failed(rc, call);
}

cudaStream_t as_stream(void* s) {
  return static_cast<cudaStream_t>(s);
}

/// The current device's default pool, its release threshold raised the first time each
/// device is seen: without it the pool hands freed memory back to the driver at every
/// stream synchronisation, and the next allocation pays cudaMalloc's cost again.
cudaMemPool_t default_pool() {
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  cudaMemPool_t pool = nullptr;
  check(cudaDeviceGetDefaultMemPool(&pool, device), "cudaDeviceGetDefaultMemPool");
  static thread_local int configured_for = -1;
  if (configured_for != device) {
    std::uint64_t keep = std::numeric_limits<std::uint64_t>::max();
    check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep),
          "cudaMemPoolSetAttribute(ReleaseThreshold)");
    configured_for = device;
  }
  return pool;
}
#endif
}  // namespace

void* allocate(Device device, std::size_t bytes, void* stream, const char* what) {
  if (bytes == 0) return nullptr;
  if (device == Device::host) {
    (void)stream;
    const std::size_t rounded = (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
    void* p = std::aligned_alloc(kHostAlignment, rounded);
    if (!p)
      throw Error(std::string("memory: cannot allocate ") + std::to_string(bytes) +
                  " bytes of host memory for " + what);
    std::memset(p, 0, rounded);
    return p;
  }
#if DSTRAIN_HAVE_CUDA
  void* p = nullptr;
  cudaMemPool_t pool = default_pool();
  const cudaError_t rc = cudaMallocFromPoolAsync(&p, bytes, pool, as_stream(stream));
  if (rc != cudaSuccess) {
    std::size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    cuda_failed(rc, std::string("cannot allocate ") + std::to_string(bytes) +
                        " bytes of device memory for " + what + " (" + std::to_string(free_b) +
                        " of " + std::to_string(total_b) + " bytes free)");
  }
  check(cudaMemsetAsync(p, 0, bytes, as_stream(stream)), "cudaMemsetAsync");
  return p;
#else
  (void)stream;
  throw Error(std::string("memory: ") + what +
              " asks for CUDA device memory, but this build has no CUDA back end "
              "(DSTRAIN_ENABLE_CUDA=OFF)");
#endif
}

void release(Device device, void* p, void* stream) noexcept {
  if (!p) return;
  if (device == Device::host) {
    std::free(p);
    return;
  }
#if DSTRAIN_HAVE_CUDA
  // At process exit the context may be gone; nothing useful can be done with a failure.
  // Clear it, or the next kernel launch's error check would report it as its own.
  if (cudaFreeAsync(p, as_stream(stream)) != cudaSuccess) (void)cudaGetLastError();
#else
  (void)stream;
#endif
}

void copy(const ExecContext& ctx, void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  if (device_of(ctx) == Device::host) {
    std::memmove(dst, src, bytes);
    return;
  }
#if DSTRAIN_HAVE_CUDA
  // cudaMemcpyDefault: the direction follows from the pointers (unified addressing).
  // Synchronised, so the documented guarantee holds for pageable host memory and pinned
  // memory alike.
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, as_stream(ctx.stream)),
        "cudaMemcpyAsync");
  check(cudaStreamSynchronize(as_stream(ctx.stream)), "cudaStreamSynchronize after a copy");
#else
  throw Error("memory: copy on the CUDA back end in a build without CUDA");
#endif
}

void fill_zero(const ExecContext& ctx, void* p, std::size_t bytes) {
  if (bytes == 0) return;
  if (device_of(ctx) == Device::host) {
    core::zero_bytes(p, bytes);  // streaming stores for ranges too large to stay in cache
    return;
  }
#if DSTRAIN_HAVE_CUDA
  check(cudaMemsetAsync(p, 0, bytes, as_stream(ctx.stream)), "cudaMemsetAsync");
#else
  throw Error("memory: fill_zero on the CUDA back end in a build without CUDA");
#endif
}

void synchronize(const ExecContext& ctx) {
  if (device_of(ctx) == Device::host) return;
#if DSTRAIN_HAVE_CUDA
  check(cudaStreamSynchronize(as_stream(ctx.stream)), "cudaStreamSynchronize");
#endif
}

void download(const ExecContext& ctx, const Tensor& t, void* host) {
  copy(ctx, host, t.data, t.bytes());
}

void upload(const ExecContext& ctx, const void* host, const Tensor& t) {
  copy(ctx, t.data, host, t.bytes());
}

std::uint64_t peak_device_bytes(Device device) {
  if (device == Device::host) return 0;
#if DSTRAIN_HAVE_CUDA
  std::uint64_t high = 0;
  check(cudaMemPoolGetAttribute(default_pool(), cudaMemPoolAttrReservedMemHigh, &high),
        "cudaMemPoolGetAttribute(ReservedMemHigh)");
  return high;
#else
  return 0;
#endif
}

}  // namespace dst::tensor
