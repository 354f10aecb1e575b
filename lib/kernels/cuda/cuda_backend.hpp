#pragma once
/// \file cuda_backend.hpp
/// The native CUDA back end's entry points (DSTRAIN_ENABLE_CUDA builds): one `run` overload
/// per kernel over the validated arguments of kernels/detail/args.hpp, the same set as
/// kokkos_backend::run plus the stream. kernels.cpp includes this header and dispatches to
/// it for ExecContext{Backend::cuda, stream}; it includes no CUDA header (the stream is a
/// cudaStream_t passed as void*; nullptr is the legacy default stream), so neither does
/// anything above the kernels layer.
///
/// Every kernel is enqueued on `stream` and returns without waiting, except where the
/// host needs an answer: the id checks of the embedding and cross-entropy kernels, and the
/// two reductions that return a host value (sum_of_squares, first_nonfinite), synchronise
/// the stream. Numerics follow the Kokkos back end operation for operation (same formulas,
/// same float/double choices); results are deterministic (kernels/cuda/detail/common.cuh)
/// and, where no reduction is involved, bitwise equal to Kokkos'. Failed CUDA calls throw
/// dst::Error naming the call and file:line.

#include "kernels/detail/args.hpp"

namespace dst::kernels::cuda_backend {

/// Throws dst::Error naming the kernel, the first bad token id and its position (nothing
/// is written then).
void run(void* stream, const kernels::detail::EmbeddingForwardArgs& a);
/// Throws dst::Error naming the kernel, the first bad token id and its position (dwte is
/// left unchanged then).
void run(void* stream, const kernels::detail::EmbeddingBackwardArgs& a);
void run(void* stream, const kernels::detail::RmsnormForwardArgs& a);
void run(void* stream, const kernels::detail::RmsnormBackwardArgs& a);
void run(void* stream, const kernels::detail::RopeTablesArgs& a);
void run(void* stream, const kernels::detail::RopeArgs& a);
void run(void* stream, const kernels::detail::SoftmaxForwardArgs& a);
void run(void* stream, const kernels::detail::SoftmaxBackwardArgs& a);
void run(void* stream, const kernels::detail::SwigluForwardArgs& a);
void run(void* stream, const kernels::detail::SwigluBackwardArgs& a);
/// Forward only when a.dlogits is nullptr. Throws dst::Error naming the first target
/// outside [0, V) that is not the ignore index, and its position (nothing is written then).
void run(void* stream, const kernels::detail::CrossEntropyArgs& a);
void run(void* stream, const kernels::detail::AddArgs& a);
void run(void* stream, const kernels::detail::AccumulateArgs& a);
void run(void* stream, const kernels::detail::ZeroArgs& a);
void run(void* stream, const kernels::detail::ScaleArgs& a);
void run(void* stream, const kernels::detail::RoundToStorageArgs& a);
/// Synchronises the stream and writes *a.result (host memory).
void run(void* stream, const kernels::detail::SumOfSquaresArgs& a);
/// Synchronises the stream and writes *a.result (host memory).
void run(void* stream, const kernels::detail::FirstNonfiniteArgs& a);
void run(void* stream, const kernels::detail::AdamwArgs& a);

}  // namespace dst::kernels::cuda_backend
