#pragma once
/// \file device.hpp
/// The device a rank drives: on CUDA builds GPU (local rank mod device count), bound
/// with cudaSetDevice; otherwise the host.

#include "runtime/runtime.hpp"

namespace dst::runtime {

/// Chooses and binds this rank's device: on a CUDA build the GPU local rank mod the device
/// count; the host on other builds, and on a CUDA build that finds no usable GPU (then
/// DeviceInfo::no_gpu_reason says why). Throws dst::Error if binding the GPU fails.
DeviceInfo select_device(int local_rank, int local_size);

/// A non-blocking CUDA stream on the bound device (a cudaStream_t), on which the model's
/// kernels, products and copies run in order; nullptr in a build without CUDA. Throws
/// dst::Error if it cannot be created.
void* create_compute_stream();
/// Destroys a stream from create_compute_stream() (nullptr is fine). Never throws.
void destroy_compute_stream(void* stream) noexcept;

/// Host memory: {MemTotal, MemAvailable} in bytes from /proc/meminfo ({0,0} if unknown).
std::pair<std::uint64_t, std::uint64_t> host_memory();

}  // namespace dst::runtime
