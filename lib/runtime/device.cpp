#include "runtime/device.hpp"

#include <fstream>
#include <sstream>
#include <string>

#include "core/error.hpp"

#if DSTRAIN_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace dst::runtime {

std::pair<std::uint64_t, std::uint64_t> host_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::uint64_t value = 0;
  std::string unit;
  std::uint64_t total = 0, avail = 0;
  while (in >> key >> value >> unit) {
    if (key == "MemTotal:") total = value * 1024;
    if (key == "MemAvailable:") avail = value * 1024;
  }
  return {total, avail};
}

namespace {
std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "host CPU";
}
}  // namespace

DeviceInfo select_device(int local_rank, int local_size) {
  DeviceInfo info;
  (void)local_rank;  // a GPU's index only
#if DSTRAIN_HAVE_CUDA
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc == cudaSuccess && count > 0) {
    info.kind = "cuda";
    info.index = local_rank % count;
    if (cudaSetDevice(info.index) != cudaSuccess)
      throw Error("start-up: cudaSetDevice(" + std::to_string(info.index) + ") failed");
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, info.index) != cudaSuccess)
      throw Error("start-up: cudaGetDeviceProperties(" + std::to_string(info.index) + ") failed");
    info.name = prop.name;
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess)
      throw Error("start-up: cudaMemGetInfo on device " + std::to_string(info.index) + " failed");
    info.memory_bytes = total_b;
    const int sharing = (local_size + count - 1) / count;
    info.available_bytes_per_rank = free_b / static_cast<std::uint64_t>(sharing);
    return info;
  }
  // A CUDA build without a usable GPU (a login node, a CPU partition, no driver) runs on
  // the host like a CPU build: kernels.backend auto resolves to kokkos there, and cuda is
  // a deck error that gives this reason (resolve_backends).
  info.no_gpu_reason = rc != cudaSuccess ? cudaGetErrorString(rc) : "0 CUDA devices";
  (void)cudaGetLastError();
#endif
  const auto [total, avail] = host_memory();
  info.kind = "host";
  info.name = cpu_model();
  info.memory_bytes = total;
  info.available_bytes_per_rank =
      avail / static_cast<std::uint64_t>(local_size > 0 ? local_size : 1);
  return info;
}

void* create_compute_stream() {
#if DSTRAIN_HAVE_CUDA
  cudaStream_t stream = nullptr;
  const cudaError_t rc = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (rc != cudaSuccess)
    throw Error(std::string("start-up: cannot create the compute stream: ") +
                cudaGetErrorString(rc));
  return stream;
#else
  return nullptr;
#endif
}

void destroy_compute_stream(void* stream) noexcept {
#if DSTRAIN_HAVE_CUDA
  if (stream) (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream));
#else
  (void)stream;
#endif
}

}  // namespace dst::runtime
