#pragma once
/// \file cuda_check.hpp
/// Checked CUDA runtime calls and kernel launches for the CUDA back end: every failure
/// becomes a dst::Error naming the CUDA status, the call (or kernel label) and file:line.
/// Internal to kernels/cuda/.

#include <cuda_runtime_api.h>

#include <utility>

namespace dst::kernels::cuda_backend::detail {

/// Throws dst::Error("kernels::cuda: <name> (<description>) from <what> [<file>:<line>]").
[[noreturn]] void throw_cuda_error(cudaError_t status, const char* what, const char* file,
                                   int line);

#ifdef __CUDACC__
/// Launches `kernel` on `stream` and checks the launch (bad configuration, no device, an
/// earlier asynchronous fault). `label` names the kernel in the error, as the Kokkos back
/// end's labels do ("dst::kernels::<kernel>::<step>"). A failure inside the kernel is
/// reported by the next checked call on the stream.
template <class... Params, class... Args>
void launch(const char* label, const char* file, int line, void (*kernel)(Params...),
            const dim3 grid, const dim3 block, cudaStream_t stream, Args&&... args) {
  kernel<<<grid, block, 0, stream>>>(std::forward<Args>(args)...);
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) throw_cuda_error(status, label, file, line);
}
#endif

}  // namespace dst::kernels::cuda_backend::detail

/// Throws dst::Error naming the status, the call text and file:line unless `call` returns
/// cudaSuccess.
#define DST_CUDA_CHECK(call)                                                                    \
  do {                                                                                          \
    const cudaError_t dst_cuda_status_ = (call);                                                \
    if (dst_cuda_status_ != cudaSuccess)                                                        \
      ::dst::kernels::cuda_backend::detail::throw_cuda_error(dst_cuda_status_, #call, __FILE__, \
                                                             __LINE__);                         \
  } while (0)

/// DST_CUDA_LAUNCH("dst::kernels::add::elements", kernel<true>, grid, block, stream, args...)
/// (the kernel may be a template-id with commas: the arguments are forwarded as written).
#define DST_CUDA_LAUNCH(label, ...) \
  ::dst::kernels::cuda_backend::detail::launch(label, __FILE__, __LINE__, __VA_ARGS__)
