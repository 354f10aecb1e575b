// What the CUDA kernels share outside their own files: the error text of failed CUDA
// calls, the per-(device, stream) scratch, and the id check of embedding and cross-entropy.
#include <climits>
#include <mutex>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "kernels/cuda/detail/common.cuh"

namespace dst::kernels::cuda_backend::detail {

void throw_cuda_error(const cudaError_t status, const char* what, const char* file,
                      const int line) {
  throw Error(std::string("kernels::cuda: ") + cudaGetErrorName(status) + " (" +
              cudaGetErrorString(status) + ") from " + what + " [" + file + ":" +
              std::to_string(line) + "]");
}

// --- scratch -------------------------------------------------------------------------------

namespace {

/// The smallest device block: the sizes most calls need (reduction partials, flags) fit in
/// it, so most streams allocate exactly once.
constexpr std::size_t kMinScratchBytes = std::size_t{1} << 20;

struct ScratchBlock {
  int device;
  cudaStream_t stream;
  char* memory;
  std::size_t bytes;
  void* host;
};

std::mutex& scratch_mutex() {
  static std::mutex m;
  return m;
}

/// Never destroyed (see scratch.hpp): a static vector's destructor would run after the
/// CUDA runtime may have shut down.
std::vector<ScratchBlock>& scratch_blocks() {
  static auto* blocks = new std::vector<ScratchBlock>();
  return *blocks;
}

}  // namespace

Scratch scratch(cudaStream_t stream, const std::size_t device_bytes) {
  int device = 0;
  DST_CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(scratch_mutex());
  auto& blocks = scratch_blocks();
  ScratchBlock* b = nullptr;
  for (auto& x : blocks)
    if (x.device == device && x.stream == stream) b = &x;
  if (b == nullptr) {
    void* host = nullptr;
    DST_CUDA_CHECK(cudaMallocHost(&host, kHostScratchBytes));
    blocks.push_back(ScratchBlock{device, stream, nullptr, 0, host});
    b = &blocks.back();
  }
  if (b->bytes < device_bytes) {
    // Doubling keeps the number of re-allocations logarithmic in the largest request.
    const std::size_t grown = std::max({device_bytes, 2 * b->bytes, kMinScratchBytes});
    if (b->memory != nullptr) {
      DST_CUDA_CHECK(cudaFreeAsync(b->memory, stream));  // after the work queued on it
      b->memory = nullptr;
      b->bytes = 0;
    }
    void* memory = nullptr;
    DST_CUDA_CHECK(cudaMallocAsync(&memory, grown, stream));
    b->memory = static_cast<char*>(memory);
    b->bytes = grown;
  }
  return Scratch{b->memory, b->host};
}

// --- id check ------------------------------------------------------------------------------

namespace {

__global__ void find_bad_ids(const std::int32_t* ids, const Index n, const Index v,
                             const bool allow_ignore, const std::int32_t ignore_index,
                             std::int32_t* iota, unsigned long long* first) {
  unsigned long long local = ULLONG_MAX;
  for (Index i = grid_start(); i < n; i += grid_stride()) {
    const std::int32_t id = ids[i];
    const bool ok = (id >= 0 && id < v) || (allow_ignore && id == ignore_index);
    if (!ok && static_cast<unsigned long long>(i) < local)
      local = static_cast<unsigned long long>(i);
    if (iota != nullptr) iota[i] = static_cast<std::int32_t>(i);
  }
  local = warp_min(local);
  if (threadIdx.x % kWarp == 0 && local != ULLONG_MAX) atomicMin(first, local);
}

}  // namespace

Index first_bad_id(cudaStream_t stream, const std::int32_t* ids, const Index n, const Index v,
                   const bool allow_ignore, const std::int32_t ignore_index, std::int32_t* iota,
                   unsigned long long* flag, void* host) {
  DST_CUDA_CHECK(cudaMemsetAsync(flag, 0xff, sizeof *flag, stream));  // ULLONG_MAX: none
  // At most 1024 blocks: the check is a small fraction of the kernel it guards.
  const dim3 grid(static_cast<unsigned>(std::min<Index>(ceil_div(n, kElementThreads), 1024)));
  DST_CUDA_LAUNCH("dst::kernels::check_ids", find_bad_ids, grid, dim3(kElementThreads), stream, ids,
                  n, v, allow_ignore, ignore_index, iota, flag);
  auto* first = static_cast<unsigned long long*>(host);
  DST_CUDA_CHECK(cudaMemcpyAsync(first, flag, sizeof *flag, cudaMemcpyDeviceToHost, stream));
  DST_CUDA_CHECK(cudaStreamSynchronize(stream));
  return *first == ULLONG_MAX ? -1 : static_cast<Index>(*first);
}

std::int32_t id_at(cudaStream_t stream, const std::int32_t* ids, const Index pos, void* host) {
  auto* id = static_cast<std::int32_t*>(host);
  DST_CUDA_CHECK(cudaMemcpyAsync(id, ids + pos, sizeof *id, cudaMemcpyDeviceToHost, stream));
  DST_CUDA_CHECK(cudaStreamSynchronize(stream));
  return *id;
}

}  // namespace dst::kernels::cuda_backend::detail
