#pragma once
/// \file args.hpp
/// The validated arguments of each kernel as raw pointers and sizes: what kernels.cpp hands
/// to a back end after checking shapes, dtypes and devices. Back ends see no Tensor, so
/// the Kokkos back end (kernels/kokkos/) and the CUDA back end (kernels/cuda/) implement
/// the same overload set `run(const XxxArgs&)` and stay independent of each other.
/// Sizes are element counts; every float tensor is row-major and contiguous.

#include <cstddef>
#include <cstdint>

namespace dst::kernels::detail {

using Index = std::int64_t;

/// Also gather_rows (x as wte, the rows' tokens as tokens): the same checked row gather,
/// its errors naming `kernel` and the rows the ids index (`table`).
struct EmbeddingForwardArgs {
  const std::int32_t* tokens;  // (N)
  const float* wte;            // (V, C)
  float* out;                  // (N, C)
  Index n, c, v;
  const char* kernel = "embedding_forward";
  const char* table = "the vocabulary";
};

struct EmbeddingBackwardArgs {
  const std::int32_t* tokens;  // (N)
  const float* dout;           // (N, C)
  float* dwte;                 // (V, C), accumulated
  Index n, c, v;
};

struct RmsnormForwardArgs {
  const float* x;  // (N, C)
  const float* w;  // (C)
  float eps;
  float* out;   // (N, C)
  float* rstd;  // (N)
  Index n, c;
};

struct RmsnormBackwardArgs {
  const float* dout;  // (N, C)
  const float* x;     // (N, C)
  const float* w;     // (C)
  const float* rstd;  // (N)
  float* dx;          // (N, C), accumulated
  float* dw;          // (C), accumulated
  Index n, c;
};

struct RopeTablesArgs {
  double theta;
  float* cos;  // (T, D/2)
  float* sin;  // (T, D/2)
  Index t, half;
};

struct RopeArgs {
  float* x;          // (B, T, H, D), rotated in place
  const float* cos;  // (>= T, D/2); row t is position t
  const float* sin;  // (>= T, D/2)
  Index b, t, h, half;
  bool inverse;  ///< false: forward rotation; true: its transpose (the backward)
};

struct RopeInterleavedArgs {
  float* x;          // (B, T, H, W): the last 2 * half columns of each row rotated in place
  const float* cos;  // (>= T, half); row t is position t
  const float* sin;  // (>= T, half)
  Index b, t, h, width, half;
  bool inverse;  ///< false: forward rotation; true: its transpose (the backward)
};

struct SoftmaxForwardArgs {
  const float* scores;  // (R, T) with R = B*H*T rows; may alias probs
  float scale;
  float* probs;  // (R, T)
  Index rows, t;
};

struct SoftmaxBackwardArgs {
  const float* probs;   // (R, T)
  const float* dprobs;  // (R, T); may alias dscores
  float scale;
  float* dscores;  // (R, T)
  Index rows, t;
};

struct SwigluForwardArgs {
  const float* h1;  // (N*F)
  const float* h3;  // (N*F)
  float* out;       // (N*F)
  Index n;          ///< number of elements N*F
};

struct SwigluBackwardArgs {
  const float* dout;  // (N*F)
  const float* h1;    // (N*F); may alias dh1
  const float* h3;    // (N*F); may alias dh3
  float* dh1;         // (N*F)
  float* dh3;         // (N*F)
  Index n;
};

/// DeepSeekMoE's token movement (kernels.hpp, "DeepSeekMoE token movement"); gather_rows
/// is EmbeddingForwardArgs' gather. R = N*K rows.

struct MoeCombineForwardArgs {
  const float* y;           // (R, C) the experts' outputs, rows sorted by expert
  const std::int32_t* row;  // (N, K) the row of token n's slot k, in [0, R)
  const float* weights;     // (N, K)
  float* out;               // (N, C), accumulated
  Index n, k, c;
};

struct MoeCombineBackwardArgs {
  const float* dout;        // (N, C)
  const float* y;           // (R, C)
  const std::int32_t* row;  // (N, K)
  const float* weights;     // (N, K)
  float* d_y;               // (R, C), written
  float* d_weights;         // (N, K), written
  Index n, k, c;
};

struct GatherRowsBackwardArgs {
  const float* d_out;       // (R, C)
  const std::int32_t* row;  // (N, K)
  float* dx;                // (N, C), accumulated
  Index n, k, c;
};

struct CrossEntropyArgs {
  const float* logits;          // (N, V); may alias dlogits
  const std::int32_t* targets;  // (N)
  std::int32_t ignore_index;
  float grad_scale;
  float* losses;   // (N)
  float* dlogits;  // (N, V), or nullptr for the forward only
  Index n, v;
};

/// A vocabulary split over a tensor-parallel group (kernels.hpp, "vocabulary slices"): a
/// rank's slice holds rows (or columns) [first, first + count) of a vocabulary of v ids.
struct EmbeddingSliceForwardArgs {
  const std::int32_t* tokens;  // (N)
  const float* wte;            // (count, C) the slice's rows
  float* out;                  // (N, C)
  Index n, c, first, count, v;
};

struct EmbeddingSliceBackwardArgs {
  const std::int32_t* tokens;  // (N)
  const float* dout;           // (N, C)
  float* dwte;                 // (count, C), accumulated
  Index n, c, first, count, v;
};

struct CrossEntropySliceMaxArgs {
  const float* logits;          // (N, count) the slice's columns
  const std::int32_t* targets;  // (N), checked against [0, v)
  std::int32_t ignore_index;
  std::int32_t* keys;  // (N)
  Index n, count, v;
};

struct CrossEntropySliceSumsArgs {
  float* logits;                // (N, count); exp(l - max) when keep_exp
  const std::int32_t* keys;     // (N) the group's maxima
  const std::int32_t* targets;  // (N)
  std::int32_t ignore_index;
  bool keep_exp;
  double* sums;  // (N, 2)
  Index n, count, first;
};

struct CrossEntropySliceFinishArgs {
  float* logits;                // (N, count); the gradient when with_gradient
  const std::int32_t* keys;     // (N)
  const double* sums;           // (N, 2) the group's sums
  const std::int32_t* targets;  // (N)
  std::int32_t ignore_index;
  float grad_scale;
  bool with_gradient;
  float* losses;  // (N)
  Index n, count, first;
};

struct AddArgs {
  const float* a;  // (n); may alias out
  const float* b;  // (n); may alias out
  float* out;      // (n)
  Index n;
};

struct AccumulateArgs {
  const float* x;  // (n)
  float* y;        // (n), accumulated
  Index n;
};

struct ZeroArgs {
  void* data;
  std::size_t bytes;
  std::size_t element_size;  ///< 1, 2, 4 or 8
};

struct ScaleArgs {
  float* x;  // (n), scaled in place
  float factor;
  Index n;
};

struct RoundToStorageArgs {
  float* x;  // (n), rounded in place
  Index n;
  bool f16;  ///< true: IEEE binary16; false: bfloat16
};

struct SumOfSquaresArgs {
  const float* x;  // (n)
  Index n;
  double* result;  ///< host memory: the sum
};

struct SumOfSquaresIntoArgs {
  const float* x;  // (n)
  Index n;
  double* out;  ///< the back end's memory: receives the sum
};

struct FirstNonfiniteArgs {
  const float* x;  // (n)
  Index n;
  Index* result;  ///< host memory: the first position, or -1
};

struct FirstNonfiniteMinArgs {
  const float* x;  // (n)
  Index n;
  std::uint64_t offset;
  std::uint64_t* flag;  ///< the back end's memory: lowered to offset + the first position
};

/// The float constants of one AdamW step, computed once in kernels.cpp (double, then
/// rounded) so that every back end applies exactly the same values.
struct AdamwArgs {
  float* params;       // (n)
  const float* grads;  // (n)
  float* m;            // (n)
  float* v;            // (n)
  Index n;
  float grad_scale;
  float decay;            ///< 1 - lr * weight_decay
  float lerp_weight;      ///< 1 - beta1
  float beta2;            ///< beta2
  float one_minus_beta2;  ///< 1 - beta2
  float step_size;        ///< lr / (1 - beta1^t)
  float bias2_sqrt;       ///< sqrt(1 - beta2^t)
  float eps;
};

}  // namespace dst::kernels::detail
