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

#include <cstdint>
#include <string>

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
void run(void* stream, const kernels::detail::RopeInterleavedArgs& a);
void run(void* stream, const kernels::detail::SoftmaxForwardArgs& a);
void run(void* stream, const kernels::detail::SoftmaxBackwardArgs& a);
void run(void* stream, const kernels::detail::SwigluForwardArgs& a);
void run(void* stream, const kernels::detail::SwigluBackwardArgs& a);
/// Forward only when a.dlogits is nullptr. Throws dst::Error naming the first target
/// outside [0, V) that is not the ignore index, and its position (nothing is written then).
void run(void* stream, const kernels::detail::CrossEntropyArgs& a);
/// Vocabulary slices: the id checks synchronise the stream (as the embedding's).
void run(void* stream, const kernels::detail::EmbeddingSliceForwardArgs& a);
void run(void* stream, const kernels::detail::EmbeddingSliceBackwardArgs& a);
void run(void* stream, const kernels::detail::CrossEntropySliceMaxArgs& a);
void run(void* stream, const kernels::detail::CrossEntropySliceSumsArgs& a);
void run(void* stream, const kernels::detail::CrossEntropySliceFinishArgs& a);
void run(void* stream, const kernels::detail::AddArgs& a);
void run(void* stream, const kernels::detail::AccumulateArgs& a);
void run(void* stream, const kernels::detail::ZeroArgs& a);
void run(void* stream, const kernels::detail::ScaleArgs& a);
void run(void* stream, const kernels::detail::RoundToStorageArgs& a);
/// Synchronises the stream and writes *a.result (host memory).
void run(void* stream, const kernels::detail::SumOfSquaresArgs& a);
void run(void* stream, const kernels::detail::SumOfSquaresIntoArgs& a);
/// Synchronises the stream and writes *a.result (host memory).
void run(void* stream, const kernels::detail::FirstNonfiniteArgs& a);
/// Enqueued only: lowers *a.flag (device memory) without synchronising.
void run(void* stream, const kernels::detail::FirstNonfiniteMinArgs& a);
void run(void* stream, const kernels::detail::AdamwArgs& a);
void run(void* stream, const kernels::detail::GatherRowsBackwardArgs& a);
void run(void* stream, const kernels::detail::MoeCombineForwardArgs& a);
void run(void* stream, const kernels::detail::MoeCombineBackwardArgs& a);

// --- fused attention (cuDNN SDPA; cuda/attention_cudnn.cpp, DSTRAIN_HAVE_CUDNN builds) ---
// Not run() overloads: the Kokkos back end has no counterpart, so these argument structs
// live here rather than in kernels/detail/args.hpp. kernels.cpp validates the tensors first.

/// One attention problem: B sequences of T tokens, H query heads and KV key/value heads of D
/// dims (H a multiple of KV), math in f16 (true) or bf16 (false).
struct FusedAttentionShape {
  std::int64_t b, t, h, kv, d;
  bool f16;
};

struct FusedAttentionForwardArgs {
  const float* q;  // (B, T, H, D)
  const float* k;  // (B, T, KV, D)
  const float* v;  // (B, T, KV, D)
  float scale;
  float* out;    // (B, T, H, D)
  float* stats;  // (B, H, T), 16-byte aligned
  FusedAttentionShape shape;
};

struct FusedAttentionBackwardArgs {
  const float* q;      // (B, T, H, D)
  const float* k;      // (B, T, KV, D)
  const float* v;      // (B, T, KV, D)
  const float* out;    // (B, T, H, D), the forward's
  const float* dout;   // (B, T, H, D)
  const float* stats;  // (B, H, T), the forward's, 16-byte aligned
  float scale;
  float* dq;  // (B, T, H, D), written
  float* dk;  // (B, T, KV, D), written
  float* dv;  // (B, T, KV, D), written
  FusedAttentionShape shape;
};

/// Whether cuDNN runs this shape on the current device: builds the forward and the backward
/// execution plans the first time a (device, thread, shape) is asked and caches them (and a
/// refusal, with its reason). Never throws for "not supported"; when it returns false and
/// `why` is not null, *why says which step refused and cuDNN's status and message.
bool fused_attention_supported(const FusedAttentionShape& shape, std::string* why);
/// Enqueues the conversions, the cuDNN forward plan and the conversion back on `stream`.
/// Throws dst::Error (nothing enqueued) when the shape is not supported or stats is not
/// 16-byte aligned, and dst::Error naming the call, status and shape when cuDNN fails.
void fused_attention_forward(void* stream, const FusedAttentionForwardArgs& a);
/// As the forward, for the backward plan.
void fused_attention_backward(void* stream, const FusedAttentionBackwardArgs& a);

}  // namespace dst::kernels::cuda_backend
