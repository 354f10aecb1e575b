// The kernel interface: validate shapes, dtypes and devices here, once for every back end,
// then hand raw pointers and sizes (detail/args.hpp) to the back end the context names.
#include "kernels/kernels.hpp"

#include <cmath>
#include <string>

#include "kernels/detail/args.hpp"
#include "kernels/kokkos/kokkos_backend.hpp"

// --- CUDA back end --------------------------------------------------------------------
// The native CUDA kernels (kernels/cuda/, DSTRAIN_ENABLE_CUDA) plug in here:
// kernels/cuda/cuda_backend.hpp declares, in dst::kernels::cuda_backend,
// `void run(void* stream, const detail::XxxArgs&)` for every Args type of detail/args.hpp
// (the same overload set as kokkos_backend::run, plus the stream), and dispatch() below
// calls it. A CUDA build without that header would report that it has no kernels.
#if DSTRAIN_HAVE_CUDA && __has_include("kernels/cuda/cuda_backend.hpp")
#include "kernels/cuda/cuda_backend.hpp"
#define DSTRAIN_KERNELS_CUDA_BACKEND 1
#else
#define DSTRAIN_KERNELS_CUDA_BACKEND 0
#endif

namespace dst::kernels {
namespace {

using tensor::Backend;
using tensor::Device;
using tensor::Shape;
using Index = std::int64_t;

/// Throws unless the context's back end can run here (before any shape check, so a CPU
/// build asked for CUDA says exactly that).
void check_backend(const ExecContext& ctx, const char* kernel) {
  switch (ctx.backend) {
    case Backend::kokkos:
      if (!kokkos_backend::initialized())
        throw Error(std::string("kernels::") + kernel +
                    ": Kokkos is not initialised (runtime start-up, or a test environment, "
                    "calls Kokkos::initialize before any kernel)");
      return;
    case Backend::cuda:
#if !DSTRAIN_HAVE_CUDA
      throw Error("kernels: the CUDA back end is not built (DSTRAIN_ENABLE_CUDA=OFF)");
#elif !DSTRAIN_KERNELS_CUDA_BACKEND
      throw Error(std::string("kernels::") + kernel +
                  ": the CUDA back end has no kernels yet (kernels/cuda/ is not written)");
#else
      return;
#endif
  }
  throw Error(std::string("kernels::") + kernel + ": unknown back end " +
              std::to_string(static_cast<int>(ctx.backend)));
}

Device device_of(const ExecContext& ctx) {
  return ctx.backend == Backend::cuda ? Device::cuda : kokkos_backend::device();
}

const char* device_name(Device d) {
  return d == Device::cuda ? "cuda" : "host";
}

std::string what(const char* kernel, const char* name) {
  return std::string("kernels::") + kernel + ": " + name;
}

/// Shape and dtype (expect_shape's message, prefixed "kernels::<kernel>: <name>"), then
/// memory: a non-empty tensor needs data, on the device the back end runs on.
void expect(const ExecContext& ctx, const Tensor& t, const Shape& shape, DType dtype,
            const char* kernel, const char* name) {
  tensor::expect_shape(t, shape, dtype, what(kernel, name).c_str());
  if (t.numel() > 0 && t.data == nullptr)
    throw Error(what(kernel, name) + ": " + shape.str() + " tensor without data");
  if (t.device != device_of(ctx))
    throw Error(what(kernel, name) + ": tensor on " + device_name(t.device) + ", but the " +
                std::string(tensor::backend_name(ctx.backend)) + " back end runs on " +
                device_name(device_of(ctx)));
}

/// For tensors whose shape the others derive from: dtype and a rank of at least
/// `min_rank` ("(N, C)" tensors may carry leading dims, (B, T, C); N is their product).
void expect_rank(const Tensor& t, int min_rank, DType dtype, const char* kernel, const char* name,
                 const char* form) {
  if (t.shape.rank < min_rank || t.dtype != dtype)
    throw Error(what(kernel, name) + ": expected " + std::string(dtype_name(dtype)) + " " + form +
                ", got " + std::string(dtype_name(t.dtype)) + " " + t.shape.str());
}

Shape drop_last(Shape s) {
  s.dims[static_cast<std::size_t>(s.rank - 1)] = 1;
  --s.rank;
  return s;
}

Shape append(Shape s, Index d) {
  if (s.rank >= tensor::kMaxRank)
    throw Error("kernels: cannot append a dimension to " + s.str() + " (rank limit)");
  s.dims[static_cast<std::size_t>(s.rank)] = d;
  ++s.rank;
  return s;
}

Index last(const Shape& s) {
  return s[s.rank - 1];
}

template <class Args>
void dispatch(const ExecContext& ctx, const Args& args) {
  if (ctx.backend == Backend::kokkos) {
    kokkos_backend::run(args);
    return;
  }
#if DSTRAIN_KERNELS_CUDA_BACKEND
  cuda_backend::run(ctx.stream, args);
#else
  (void)args;  // check_backend has already thrown
#endif
}

}  // namespace

// --- embedding -------------------------------------------------------------------------

void embedding_forward(const ExecContext& ctx, const Tensor& tokens, const Tensor& wte,
                       const Tensor& out) {
  constexpr const char* k = "embedding_forward";
  check_backend(ctx, k);
  expect_rank(tokens, 1, DType::i32, k, "tokens", "(N)");
  expect_rank(wte, 2, DType::f32, k, "wte", "(V, C)");
  expect(ctx, tokens, tokens.shape, DType::i32, k, "tokens");
  expect(ctx, wte, Shape{wte.shape[0], wte.shape[1]}, DType::f32, k, "wte");
  const Index c = wte.shape[1];
  expect(ctx, out, append(tokens.shape, c), DType::f32, k, "out");
  if (out.numel() == 0) return;
  dispatch(ctx, detail::EmbeddingForwardArgs{tokens.ptr<std::int32_t>(), wte.ptr<float>(),
                                             out.ptr<float>(), tokens.numel(), c, wte.shape[0]});
}

void embedding_backward(const ExecContext& ctx, const Tensor& tokens, const Tensor& dout,
                        const Tensor& dwte) {
  constexpr const char* k = "embedding_backward";
  check_backend(ctx, k);
  expect_rank(tokens, 1, DType::i32, k, "tokens", "(N)");
  expect_rank(dwte, 2, DType::f32, k, "dwte", "(V, C)");
  expect(ctx, tokens, tokens.shape, DType::i32, k, "tokens");
  expect(ctx, dwte, Shape{dwte.shape[0], dwte.shape[1]}, DType::f32, k, "dwte");
  const Index c = dwte.shape[1];
  expect(ctx, dout, append(tokens.shape, c), DType::f32, k, "dout");
  if (dout.numel() == 0) return;
  dispatch(ctx, detail::EmbeddingBackwardArgs{tokens.ptr<std::int32_t>(), dout.ptr<float>(),
                                              dwte.ptr<float>(), tokens.numel(), c, dwte.shape[0]});
}

// --- RMSNorm ---------------------------------------------------------------------------

void rmsnorm_forward(const ExecContext& ctx, const Tensor& x, const Tensor& w, float eps,
                     const Tensor& out, const Tensor& rstd) {
  constexpr const char* k = "rmsnorm_forward";
  check_backend(ctx, k);
  expect_rank(x, 2, DType::f32, k, "x", "(N, C)");
  const Index c = last(x.shape);
  expect(ctx, x, x.shape, DType::f32, k, "x");
  expect(ctx, w, Shape{c}, DType::f32, k, "w");
  expect(ctx, out, x.shape, DType::f32, k, "out");
  expect(ctx, rstd, drop_last(x.shape), DType::f32, k, "rstd");
  if (!(eps >= 0.0f) || !std::isfinite(eps))
    throw Error(what(k, "eps") + " must be finite and >= 0, got " + std::to_string(eps));
  if (x.numel() == 0 && rstd.numel() > 0)
    throw Error(what(k, "x") + ": C = 0, the mean of an empty row is undefined");
  if (x.numel() == 0) return;
  dispatch(ctx, detail::RmsnormForwardArgs{x.ptr<float>(), w.ptr<float>(), eps, out.ptr<float>(),
                                           rstd.ptr<float>(), rstd.numel(), c});
}

void rmsnorm_backward(const ExecContext& ctx, const Tensor& dout, const Tensor& x, const Tensor& w,
                      const Tensor& rstd, const Tensor& dx, const Tensor& dw) {
  constexpr const char* k = "rmsnorm_backward";
  check_backend(ctx, k);
  expect_rank(x, 2, DType::f32, k, "x", "(N, C)");
  const Index c = last(x.shape);
  expect(ctx, x, x.shape, DType::f32, k, "x");
  expect(ctx, dout, x.shape, DType::f32, k, "dout");
  expect(ctx, w, Shape{c}, DType::f32, k, "w");
  expect(ctx, rstd, drop_last(x.shape), DType::f32, k, "rstd");
  expect(ctx, dx, x.shape, DType::f32, k, "dx");
  expect(ctx, dw, Shape{c}, DType::f32, k, "dw");
  if (x.numel() == 0) return;
  dispatch(ctx, detail::RmsnormBackwardArgs{dout.ptr<float>(), x.ptr<float>(), w.ptr<float>(),
                                            rstd.ptr<float>(), dx.ptr<float>(), dw.ptr<float>(),
                                            rstd.numel(), c});
}

// --- rotary embeddings -----------------------------------------------------------------

void rope_tables(const ExecContext& ctx, double theta, const Tensor& cos, const Tensor& sin) {
  constexpr const char* k = "rope_tables";
  check_backend(ctx, k);
  expect_rank(cos, 2, DType::f32, k, "cos", "(T, D/2)");
  expect(ctx, cos, Shape{cos.shape[0], cos.shape[1]}, DType::f32, k, "cos");
  expect(ctx, sin, cos.shape, DType::f32, k, "sin");
  if (!(theta > 0.0) || !std::isfinite(theta))
    throw Error(what(k, "theta") + " must be finite and > 0, got " + std::to_string(theta));
  if (cos.numel() == 0) return;
  dispatch(ctx, detail::RopeTablesArgs{theta, cos.ptr<float>(), sin.ptr<float>(), cos.shape[0],
                                       cos.shape[1]});
}

namespace {
void rope_apply(const ExecContext& ctx, const char* k, const Tensor& x, const Tensor& cos,
                const Tensor& sin, bool inverse) {
  check_backend(ctx, k);
  if (x.shape.rank != 4 || x.dtype != DType::f32)
    throw Error(what(k, "x") + ": expected f32 (B, T, H, D), got " +
                std::string(dtype_name(x.dtype)) + " " + x.shape.str());
  expect(ctx, x, x.shape, DType::f32, k, "x");
  const Index t = x.shape[1];
  const Index d = x.shape[3];
  if (d % 2 != 0) throw Error(what(k, "x") + ": head dim D = " + std::to_string(d) + " is odd");
  // The tables may cover more positions than this sequence (sized for the longest one).
  if (cos.shape.rank != 2 || cos.shape[0] < t || cos.shape[1] != d / 2 || cos.dtype != DType::f32)
    throw Error(what(k, "cos") + ": expected f32 (>= " + std::to_string(t) + ", " +
                std::to_string(d / 2) + ") for x " + x.shape.str() + ", got " +
                std::string(dtype_name(cos.dtype)) + " " + cos.shape.str());
  expect(ctx, cos, cos.shape, DType::f32, k, "cos");
  expect(ctx, sin, cos.shape, DType::f32, k, "sin");
  if (x.numel() == 0) return;
  dispatch(ctx, detail::RopeArgs{x.ptr<float>(), cos.ptr<float>(), sin.ptr<float>(), x.shape[0], t,
                                 x.shape[2], d / 2, inverse});
}
}  // namespace

void rope_forward(const ExecContext& ctx, const Tensor& x, const Tensor& cos, const Tensor& sin) {
  rope_apply(ctx, "rope_forward", x, cos, sin, false);
}

void rope_backward(const ExecContext& ctx, const Tensor& dx, const Tensor& cos, const Tensor& sin) {
  rope_apply(ctx, "rope_backward", dx, cos, sin, true);
}

namespace {
void rope_interleaved_apply(const ExecContext& ctx, const char* k, const Tensor& x,
                            const Tensor& cos, const Tensor& sin, bool inverse) {
  check_backend(ctx, k);
  if (x.shape.rank != 4 || x.dtype != DType::f32)
    throw Error(what(k, "x") + ": expected f32 (B, T, H, W), got " +
                std::string(dtype_name(x.dtype)) + " " + x.shape.str());
  expect(ctx, x, x.shape, DType::f32, k, "x");
  const Index t = x.shape[1];
  const Index w = x.shape[3];
  // The tables may cover more positions than this sequence (sized for the longest one).
  if (cos.shape.rank != 2 || cos.shape[0] < t || 2 * cos.shape[1] > w || cos.shape[1] < 1 ||
      cos.dtype != DType::f32)
    throw Error(what(k, "cos") + ": expected f32 (>= " + std::to_string(t) + ", 1 .. " +
                std::to_string(w / 2) + ") for x " + x.shape.str() + ", got " +
                std::string(dtype_name(cos.dtype)) + " " + cos.shape.str());
  expect(ctx, cos, cos.shape, DType::f32, k, "cos");
  expect(ctx, sin, cos.shape, DType::f32, k, "sin");
  if (x.numel() == 0) return;
  dispatch(ctx, detail::RopeInterleavedArgs{x.ptr<float>(), cos.ptr<float>(), sin.ptr<float>(),
                                            x.shape[0], t, x.shape[2], w, cos.shape[1], inverse});
}
}  // namespace

void rope_interleaved_forward(const ExecContext& ctx, const Tensor& x, const Tensor& cos,
                              const Tensor& sin) {
  rope_interleaved_apply(ctx, "rope_interleaved_forward", x, cos, sin, false);
}

void rope_interleaved_backward(const ExecContext& ctx, const Tensor& dx, const Tensor& cos,
                               const Tensor& sin) {
  rope_interleaved_apply(ctx, "rope_interleaved_backward", dx, cos, sin, true);
}

// --- attention softmax -----------------------------------------------------------------

namespace {
/// (..., T, T): the last two dims are the query and key positions.
Index square_rows(const Tensor& t, const char* k, const char* name) {
  expect_rank(t, 2, DType::f32, k, name, "(B, H, T, T)");
  const Index len = last(t.shape);
  if (t.shape[t.shape.rank - 2] != len)
    throw Error(what(k, name) + ": expected f32 (B, H, T, T) with equal last two dims, got " +
                t.shape.str());
  return len;
}
}  // namespace

void causal_softmax_forward(const ExecContext& ctx, const Tensor& scores, float scale,
                            const Tensor& probs) {
  constexpr const char* k = "causal_softmax_forward";
  check_backend(ctx, k);
  const Index t = square_rows(scores, k, "scores");
  expect(ctx, scores, scores.shape, DType::f32, k, "scores");
  expect(ctx, probs, scores.shape, DType::f32, k, "probs");
  if (!std::isfinite(scale))
    throw Error(what(k, "scale") + " must be finite, got " + std::to_string(scale));
  if (scores.numel() == 0) return;
  dispatch(ctx, detail::SoftmaxForwardArgs{scores.ptr<float>(), scale, probs.ptr<float>(),
                                           scores.numel() / t, t});
}

void causal_softmax_backward(const ExecContext& ctx, const Tensor& probs, const Tensor& dprobs,
                             float scale, const Tensor& dscores) {
  constexpr const char* k = "causal_softmax_backward";
  check_backend(ctx, k);
  const Index t = square_rows(probs, k, "probs");
  expect(ctx, probs, probs.shape, DType::f32, k, "probs");
  expect(ctx, dprobs, probs.shape, DType::f32, k, "dprobs");
  expect(ctx, dscores, probs.shape, DType::f32, k, "dscores");
  if (!std::isfinite(scale))
    throw Error(what(k, "scale") + " must be finite, got " + std::to_string(scale));
  if (probs.numel() == 0) return;
  dispatch(ctx, detail::SoftmaxBackwardArgs{probs.ptr<float>(), dprobs.ptr<float>(), scale,
                                            dscores.ptr<float>(), probs.numel() / t, t});
}

AttentionGrouping attention_grouping(const ExecContext& ctx) {
  if (ctx.backend == Backend::cuda) return AttentionGrouping{false, 0};
  // 64 rows: several of OpenBLAS's 16- or 32-row micro-kernel panels (ten 6-row tiles and
  // one of 4 in dstrain's kernel, blas::small_gemm_strided_batched, which runs these
  // products on AVX-512 CPUs), so the shorter products keep their efficiency (fewer,
  // larger blocks skip less; more blocks pay a call per block and head).
  return AttentionGrouping{true, 64};
}

// --- SwiGLU ------------------------------------------------------------------------------

void swiglu_forward(const ExecContext& ctx, const Tensor& h1, const Tensor& h3, const Tensor& out) {
  constexpr const char* k = "swiglu_forward";
  check_backend(ctx, k);
  expect_rank(h1, 1, DType::f32, k, "h1", "(N, F)");
  expect(ctx, h1, h1.shape, DType::f32, k, "h1");
  expect(ctx, h3, h1.shape, DType::f32, k, "h3");
  expect(ctx, out, h1.shape, DType::f32, k, "out");
  if (h1.numel() == 0) return;
  dispatch(ctx, detail::SwigluForwardArgs{h1.ptr<float>(), h3.ptr<float>(), out.ptr<float>(),
                                          h1.numel()});
}

void swiglu_backward(const ExecContext& ctx, const Tensor& dout, const Tensor& h1, const Tensor& h3,
                     const Tensor& dh1, const Tensor& dh3) {
  constexpr const char* k = "swiglu_backward";
  check_backend(ctx, k);
  expect_rank(h1, 1, DType::f32, k, "h1", "(N, F)");
  expect(ctx, h1, h1.shape, DType::f32, k, "h1");
  expect(ctx, h3, h1.shape, DType::f32, k, "h3");
  expect(ctx, dout, h1.shape, DType::f32, k, "dout");
  expect(ctx, dh1, h1.shape, DType::f32, k, "dh1");
  expect(ctx, dh3, h1.shape, DType::f32, k, "dh3");
  if (h1.numel() == 0) return;
  dispatch(ctx, detail::SwigluBackwardArgs{dout.ptr<float>(), h1.ptr<float>(), h3.ptr<float>(),
                                           dh1.ptr<float>(), dh3.ptr<float>(), h1.numel()});
}

// --- DeepSeekMoE token movement -------------------------------------------------------

void gather_rows(const ExecContext& ctx, const Tensor& x, const Tensor& token, const Tensor& out) {
  constexpr const char* k = "gather_rows";
  check_backend(ctx, k);
  expect_rank(x, 2, DType::f32, k, "x", "(N, C)");
  expect_rank(token, 1, DType::i32, k, "token", "(R)");
  expect(ctx, x, Shape{x.shape[0], x.shape[1]}, DType::f32, k, "x");
  expect(ctx, token, Shape{token.shape[0]}, DType::i32, k, "token");
  expect(ctx, out, Shape{token.shape[0], x.shape[1]}, DType::f32, k, "out");
  if (out.numel() == 0) return;
  // The embedding's checked gather: x's rows are its table, the rows' tokens its ids.
  dispatch(ctx, detail::EmbeddingForwardArgs{token.ptr<std::int32_t>(), x.ptr<float>(),
                                             out.ptr<float>(), token.shape[0], x.shape[1],
                                             x.shape[0], k, "the rows of x"});
}

void gather_rows_backward(const ExecContext& ctx, const Tensor& d_out, const Tensor& row,
                          const Tensor& dx) {
  constexpr const char* k = "gather_rows_backward";
  check_backend(ctx, k);
  expect_rank(d_out, 2, DType::f32, k, "d_out", "(R, C)");
  expect_rank(row, 2, DType::i32, k, "row", "(N, K)");
  expect(ctx, d_out, Shape{d_out.shape[0], d_out.shape[1]}, DType::f32, k, "d_out");
  expect(ctx, row, Shape{row.shape[0], row.shape[1]}, DType::i32, k, "row");
  if (row.numel() != d_out.shape[0])
    throw Error(what(k, "row") + ": " + row.shape.str() + " names " + std::to_string(row.numel()) +
                " rows, d_out has " + std::to_string(d_out.shape[0]));
  expect(ctx, dx, Shape{row.shape[0], d_out.shape[1]}, DType::f32, k, "dx");
  if (dx.numel() == 0) return;
  dispatch(ctx, detail::GatherRowsBackwardArgs{d_out.ptr<float>(), row.ptr<std::int32_t>(),
                                               dx.ptr<float>(), row.shape[0], row.shape[1],
                                               d_out.shape[1]});
}

namespace {
/// y (R, C), row (N, K), weights (N, K): the shapes both combine kernels share.
void expect_combine(const ExecContext& ctx, const char* k, const Tensor& y, const Tensor& row,
                    const Tensor& weights) {
  expect_rank(y, 2, DType::f32, k, "y", "(R, C)");
  expect_rank(row, 2, DType::i32, k, "row", "(N, K)");
  expect(ctx, y, Shape{y.shape[0], y.shape[1]}, DType::f32, k, "y");
  expect(ctx, row, Shape{row.shape[0], row.shape[1]}, DType::i32, k, "row");
  if (row.numel() != y.shape[0])
    throw Error(what(k, "row") + ": " + row.shape.str() + " names " + std::to_string(row.numel()) +
                " rows, y has " + std::to_string(y.shape[0]));
  expect(ctx, weights, row.shape, DType::f32, k, "weights");
}
}  // namespace

void moe_combine_forward(const ExecContext& ctx, const Tensor& y, const Tensor& row,
                         const Tensor& weights, const Tensor& out) {
  constexpr const char* k = "moe_combine_forward";
  check_backend(ctx, k);
  expect_combine(ctx, k, y, row, weights);
  expect(ctx, out, Shape{row.shape[0], y.shape[1]}, DType::f32, k, "out");
  if (out.numel() == 0) return;
  dispatch(ctx, detail::MoeCombineForwardArgs{y.ptr<float>(), row.ptr<std::int32_t>(),
                                              weights.ptr<float>(), out.ptr<float>(), row.shape[0],
                                              row.shape[1], y.shape[1]});
}

void moe_combine_backward(const ExecContext& ctx, const Tensor& dout, const Tensor& y,
                          const Tensor& row, const Tensor& weights, const Tensor& d_y,
                          const Tensor& d_weights) {
  constexpr const char* k = "moe_combine_backward";
  check_backend(ctx, k);
  expect_combine(ctx, k, y, row, weights);
  expect(ctx, dout, Shape{row.shape[0], y.shape[1]}, DType::f32, k, "dout");
  expect(ctx, d_y, y.shape, DType::f32, k, "d_y");
  expect(ctx, d_weights, row.shape, DType::f32, k, "d_weights");
  if (row.numel() == 0) return;
  dispatch(ctx, detail::MoeCombineBackwardArgs{dout.ptr<float>(), y.ptr<float>(),
                                               row.ptr<std::int32_t>(), weights.ptr<float>(),
                                               d_y.ptr<float>(), d_weights.ptr<float>(),
                                               row.shape[0], row.shape[1], y.shape[1]});
}

// --- cross-entropy -----------------------------------------------------------------------

namespace {
void cross_entropy(const ExecContext& ctx, const char* k, const Tensor& logits,
                   const Tensor& targets, std::int32_t ignore_index, float grad_scale,
                   const Tensor& losses, const Tensor* dlogits) {
  check_backend(ctx, k);
  expect_rank(logits, 2, DType::f32, k, "logits", "(N, V)");
  const Index v = last(logits.shape);
  expect(ctx, logits, logits.shape, DType::f32, k, "logits");
  expect(ctx, targets, drop_last(logits.shape), DType::i32, k, "targets");
  expect(ctx, losses, drop_last(logits.shape), DType::f32, k, "losses");
  if (dlogits != nullptr) {
    expect(ctx, *dlogits, logits.shape, DType::f32, k, "dlogits");
    if (!std::isfinite(grad_scale))
      throw Error(what(k, "grad_scale") + " must be finite, got " + std::to_string(grad_scale));
  }
  if (v == 0 && targets.numel() > 0)
    throw Error(what(k, "logits") + ": V = 0, no class to predict");
  if (targets.numel() == 0) return;
  dispatch(ctx, detail::CrossEntropyArgs{logits.ptr<float>(), targets.ptr<std::int32_t>(),
                                         ignore_index, grad_scale, losses.ptr<float>(),
                                         dlogits != nullptr ? dlogits->ptr<float>() : nullptr,
                                         targets.numel(), v});
}
}  // namespace

void cross_entropy_forward(const ExecContext& ctx, const Tensor& logits, const Tensor& targets,
                           std::int32_t ignore_index, const Tensor& losses) {
  cross_entropy(ctx, "cross_entropy_forward", logits, targets, ignore_index, 1.0f, losses, nullptr);
}

void cross_entropy_fused(const ExecContext& ctx, const Tensor& logits, const Tensor& targets,
                         std::int32_t ignore_index, float grad_scale, const Tensor& losses,
                         const Tensor& dlogits) {
  cross_entropy(ctx, "cross_entropy_fused", logits, targets, ignore_index, grad_scale, losses,
                &dlogits);
}

// --- vocabulary slices -------------------------------------------------------------------

namespace {
/// Throws unless [first, first + count) is a slice of a vocabulary of `vocab` ids.
void expect_slice(const char* k, std::int64_t first, std::int64_t count, std::int64_t vocab) {
  if (first < 0 || count < 0 || first + count > vocab)
    throw Error(what(k, "slice") + ": ids [" + std::to_string(first) + ", " +
                std::to_string(first + count) + ") are not within a vocabulary of " +
                std::to_string(vocab));
}
}  // namespace

void embedding_slice_forward(const ExecContext& ctx, const Tensor& tokens, const Tensor& wte,
                             std::int64_t first, std::int64_t vocab, const Tensor& out) {
  constexpr const char* k = "embedding_slice_forward";
  check_backend(ctx, k);
  expect_rank(tokens, 1, DType::i32, k, "tokens", "(N)");
  expect_rank(wte, 2, DType::f32, k, "wte", "(count, C)");
  expect(ctx, tokens, tokens.shape, DType::i32, k, "tokens");
  expect(ctx, wte, Shape{wte.shape[0], wte.shape[1]}, DType::f32, k, "wte");
  expect_slice(k, first, wte.shape[0], vocab);
  const Index c = wte.shape[1];
  expect(ctx, out, append(tokens.shape, c), DType::f32, k, "out");
  if (tokens.numel() == 0) return;
  dispatch(ctx, detail::EmbeddingSliceForwardArgs{tokens.ptr<std::int32_t>(), wte.ptr<float>(),
                                                  out.ptr<float>(), tokens.numel(), c, first,
                                                  wte.shape[0], vocab});
}

void embedding_slice_backward(const ExecContext& ctx, const Tensor& tokens, const Tensor& dout,
                              std::int64_t first, std::int64_t vocab, const Tensor& dwte) {
  constexpr const char* k = "embedding_slice_backward";
  check_backend(ctx, k);
  expect_rank(tokens, 1, DType::i32, k, "tokens", "(N)");
  expect_rank(dwte, 2, DType::f32, k, "dwte", "(count, C)");
  expect(ctx, tokens, tokens.shape, DType::i32, k, "tokens");
  expect(ctx, dwte, Shape{dwte.shape[0], dwte.shape[1]}, DType::f32, k, "dwte");
  expect_slice(k, first, dwte.shape[0], vocab);
  const Index c = dwte.shape[1];
  expect(ctx, dout, append(tokens.shape, c), DType::f32, k, "dout");
  if (tokens.numel() == 0) return;
  dispatch(ctx, detail::EmbeddingSliceBackwardArgs{tokens.ptr<std::int32_t>(), dout.ptr<float>(),
                                                   dwte.ptr<float>(), tokens.numel(), c, first,
                                                   dwte.shape[0], vocab});
}

void cross_entropy_slice_max(const ExecContext& ctx, const Tensor& logits, const Tensor& targets,
                             std::int32_t ignore_index, std::int64_t vocab, const Tensor& keys) {
  constexpr const char* k = "cross_entropy_slice_max";
  check_backend(ctx, k);
  expect_rank(logits, 2, DType::f32, k, "logits", "(N, count)");
  expect(ctx, logits, Shape{logits.shape[0], logits.shape[1]}, DType::f32, k, "logits");
  expect(ctx, targets, Shape{logits.shape[0]}, DType::i32, k, "targets");
  expect(ctx, keys, Shape{logits.shape[0]}, DType::i32, k, "keys");
  expect_slice(k, 0, logits.shape[1], vocab);
  if (logits.shape[1] == 0 && logits.shape[0] > 0)
    throw Error(what(k, "logits") + ": an empty slice, no class to predict");
  if (logits.shape[0] == 0) return;
  dispatch(ctx, detail::CrossEntropySliceMaxArgs{logits.ptr<float>(), targets.ptr<std::int32_t>(),
                                                 ignore_index, keys.ptr<std::int32_t>(),
                                                 logits.shape[0], logits.shape[1], vocab});
}

void cross_entropy_slice_sums(const ExecContext& ctx, const Tensor& logits, const Tensor& keys,
                              const Tensor& targets, std::int32_t ignore_index, std::int64_t first,
                              bool keep_exp, const Tensor& sums) {
  constexpr const char* k = "cross_entropy_slice_sums";
  check_backend(ctx, k);
  expect_rank(logits, 2, DType::f32, k, "logits", "(N, count)");
  const Index n = logits.shape[0];
  expect(ctx, logits, Shape{n, logits.shape[1]}, DType::f32, k, "logits");
  expect(ctx, keys, Shape{n}, DType::i32, k, "keys");
  expect(ctx, targets, Shape{n}, DType::i32, k, "targets");
  expect(ctx, sums, Shape{n, 2}, DType::f64, k, "sums");
  if (first < 0) throw Error(what(k, "first") + " must be >= 0, got " + std::to_string(first));
  if (n == 0) return;
  dispatch(ctx, detail::CrossEntropySliceSumsArgs{
                    logits.ptr<float>(), keys.ptr<std::int32_t>(), targets.ptr<std::int32_t>(),
                    ignore_index, keep_exp, sums.ptr<double>(), n, logits.shape[1], first});
}

void cross_entropy_slice_finish(const ExecContext& ctx, const Tensor& logits, const Tensor& keys,
                                const Tensor& sums, const Tensor& targets,
                                std::int32_t ignore_index, std::int64_t first, float grad_scale,
                                bool with_gradient, const Tensor& losses) {
  constexpr const char* k = "cross_entropy_slice_finish";
  check_backend(ctx, k);
  expect_rank(logits, 2, DType::f32, k, "logits", "(N, count)");
  const Index n = logits.shape[0];
  expect(ctx, logits, Shape{n, logits.shape[1]}, DType::f32, k, "logits");
  expect(ctx, keys, Shape{n}, DType::i32, k, "keys");
  expect(ctx, sums, Shape{n, 2}, DType::f64, k, "sums");
  expect(ctx, targets, Shape{n}, DType::i32, k, "targets");
  expect(ctx, losses, Shape{n}, DType::f32, k, "losses");
  if (first < 0) throw Error(what(k, "first") + " must be >= 0, got " + std::to_string(first));
  if (with_gradient && !std::isfinite(grad_scale))
    throw Error(what(k, "grad_scale") + " must be finite, got " + std::to_string(grad_scale));
  if (n == 0) return;
  dispatch(ctx, detail::CrossEntropySliceFinishArgs{
                    logits.ptr<float>(), keys.ptr<std::int32_t>(), sums.ptr<double>(),
                    targets.ptr<std::int32_t>(), ignore_index, grad_scale, with_gradient,
                    losses.ptr<float>(), n, logits.shape[1], first});
}

// --- elementwise -------------------------------------------------------------------------

void add(const ExecContext& ctx, const Tensor& a, const Tensor& b, const Tensor& out) {
  constexpr const char* k = "add";
  check_backend(ctx, k);
  expect(ctx, a, a.shape, DType::f32, k, "a");
  expect(ctx, b, a.shape, DType::f32, k, "b");
  expect(ctx, out, a.shape, DType::f32, k, "out");
  if (a.numel() == 0) return;
  dispatch(ctx, detail::AddArgs{a.ptr<float>(), b.ptr<float>(), out.ptr<float>(), a.numel()});
}

void accumulate(const ExecContext& ctx, const Tensor& x, const Tensor& y) {
  constexpr const char* k = "accumulate";
  check_backend(ctx, k);
  expect(ctx, x, x.shape, DType::f32, k, "x");
  expect(ctx, y, x.shape, DType::f32, k, "y");
  if (x.numel() == 0) return;
  dispatch(ctx, detail::AccumulateArgs{x.ptr<float>(), y.ptr<float>(), x.numel()});
}

void zero(const ExecContext& ctx, const Tensor& t) {
  constexpr const char* k = "zero";
  check_backend(ctx, k);
  expect(ctx, t, t.shape, t.dtype, k, "t");
  if (t.numel() == 0) return;
  dispatch(ctx, detail::ZeroArgs{t.data, t.bytes(), dtype_size(t.dtype)});
}

void scale(const ExecContext& ctx, const Tensor& x, float factor) {
  constexpr const char* k = "scale";
  check_backend(ctx, k);
  expect(ctx, x, x.shape, DType::f32, k, "x");
  if (!std::isfinite(factor))
    throw Error(what(k, "factor") + " must be finite, got " + std::to_string(factor));
  if (x.numel() == 0) return;
  dispatch(ctx, detail::ScaleArgs{x.ptr<float>(), factor, x.numel()});
}

// --- casts -------------------------------------------------------------------------------

void round_to_storage(const ExecContext& ctx, const Tensor& x, DType storage) {
  constexpr const char* k = "round_to_storage";
  check_backend(ctx, k);
  expect(ctx, x, x.shape, DType::f32, k, "x");
  if (storage != DType::f32 && storage != DType::bf16 && storage != DType::f16)
    throw Error(what(k, "storage") + " must be f32, bf16 or f16, got " +
                std::string(dtype_name(storage)));
  if (storage == DType::f32 || x.numel() == 0) return;
  dispatch(ctx, detail::RoundToStorageArgs{x.ptr<float>(), x.numel(), storage == DType::f16});
}

// --- norms -------------------------------------------------------------------------------

double sum_of_squares(const ExecContext& ctx, const Tensor& x) {
  constexpr const char* k = "sum_of_squares";
  check_backend(ctx, k);
  expect(ctx, x, x.shape, DType::f32, k, "x");
  double result = 0.0;
  if (x.numel() == 0) return result;
  dispatch(ctx, detail::SumOfSquaresArgs{x.ptr<float>(), x.numel(), &result});
  return result;
}

void sum_of_squares_into(const ExecContext& ctx, const Tensor& x, const Tensor& out,
                         std::int64_t index) {
  constexpr const char* k = "sum_of_squares_into";
  check_backend(ctx, k);
  expect(ctx, x, x.shape, DType::f32, k, "x");
  expect_rank(out, 1, DType::f64, k, "out", "(count)");
  expect(ctx, out, out.shape, DType::f64, k, "out");
  if (out.shape.rank != 1 || index < 0 || index >= out.shape[0])
    throw Error(what(k, "index") + ": " + std::to_string(index) + " is outside out " +
                out.shape.str());
  dispatch(ctx, detail::SumOfSquaresIntoArgs{x.ptr<float>(), x.numel(), out.ptr<double>() + index});
}

std::int64_t first_nonfinite(const ExecContext& ctx, const Tensor& x) {
  constexpr const char* k = "first_nonfinite";
  check_backend(ctx, k);
  expect(ctx, x, x.shape, DType::f32, k, "x");
  Index result = -1;
  if (x.numel() == 0) return result;
  dispatch(ctx, detail::FirstNonfiniteArgs{x.ptr<float>(), x.numel(), &result});
  return result;
}

void first_nonfinite_min(const ExecContext& ctx, const Tensor& x, std::uint64_t offset,
                         const Tensor& flag) {
  constexpr const char* k = "first_nonfinite_min";
  check_backend(ctx, k);
  expect(ctx, x, x.shape, DType::f32, k, "x");
  expect(ctx, flag, Shape{1}, DType::u64, k, "flag");
  if (x.numel() == 0) return;
  dispatch(ctx, detail::FirstNonfiniteMinArgs{x.ptr<float>(), x.numel(), offset,
                                              flag.ptr<std::uint64_t>()});
}

// --- AdamW -------------------------------------------------------------------------------

void adamw_step(const ExecContext& ctx, const Tensor& params, const Tensor& grads, const Tensor& m,
                const Tensor& v, const AdamWHyper& h) {
  constexpr const char* k = "adamw_step";
  check_backend(ctx, k);
  expect(ctx, params, params.shape, DType::f32, k, "params");
  expect(ctx, grads, params.shape, DType::f32, k, "grads");
  expect(ctx, m, params.shape, DType::f32, k, "m");
  expect(ctx, v, params.shape, DType::f32, k, "v");
  // Finiteness first: an ordered comparison with a NaN raises FE_INVALID (a trap in tests).
  auto check = [&](const char* name, double value, bool (*in_range)(double), const char* range) {
    if (!std::isfinite(value) || !in_range(value))
      throw Error(what(k, name) + " must be finite and " + range + ", got " +
                  std::to_string(value));
  };
  check(
      "lr", h.lr, [](double x) { return x >= 0.0; }, ">= 0");
  check(
      "beta1", h.beta1, [](double x) { return x >= 0.0 && x < 1.0; }, "in [0, 1)");
  check(
      "beta2", h.beta2, [](double x) { return x >= 0.0 && x < 1.0; }, "in [0, 1)");
  // eps is applied in float: one that rounds to 0 there would divide 0 by 0.
  check(
      "eps", h.eps, [](double x) { return static_cast<float>(x) > 0.0f; }, "> 0 in float");
  check(
      "weight_decay", h.weight_decay, [](double x) { return x >= 0.0; }, ">= 0");
  check(
      "grad_scale", h.grad_scale, [](double x) { return std::isfinite(static_cast<float>(x)); },
      "within float range");
  if (h.step < 1)
    throw Error(what(k, "step") + " is 1-based (the step being taken), got " +
                std::to_string(h.step));
  if (params.numel() == 0) return;
  // PyTorch's scalars, computed the way it computes them (Python floats, i.e. double)
  // and rounded to float where they meet the f32 tensors.
  const double t = static_cast<double>(h.step);
  const double bias1 = 1.0 - std::pow(h.beta1, t);
  const double bias2 = 1.0 - std::pow(h.beta2, t);
  detail::AdamwArgs a{params.ptr<float>(),
                      grads.ptr<float>(),
                      m.ptr<float>(),
                      v.ptr<float>(),
                      params.numel(),
                      static_cast<float>(h.grad_scale),
                      static_cast<float>(1.0 - h.lr * h.weight_decay),
                      static_cast<float>(1.0 - h.beta1),
                      static_cast<float>(h.beta2),
                      static_cast<float>(1.0 - h.beta2),
                      static_cast<float>(h.lr / bias1),
                      static_cast<float>(std::sqrt(bias2)),
                      static_cast<float>(h.eps)};
  dispatch(ctx, a);
}

// --- fused attention ---------------------------------------------------------------------
// cuDNN SDPA on the CUDA back end only (kernels/cuda/attention_cudnn.cpp, built when CMake
// finds cuDNN 9: DSTRAIN_HAVE_CUDNN). Everything a caller can get wrong is checked here first;
// whether cuDNN takes the shape is the back end's answer, cached per shape.

#ifndef DSTRAIN_HAVE_CUDNN
#define DSTRAIN_HAVE_CUDNN 0
#endif
#define DSTRAIN_KERNELS_FUSED_ATTENTION (DSTRAIN_KERNELS_CUDA_BACKEND && DSTRAIN_HAVE_CUDNN)

namespace {

struct AttentionDims {
  Index b, t, h, kv, d;
};

/// The fused path exists only on the CUDA back end, in a build with cuDNN, in 16-bit math;
/// anything else throws before the tensors are looked at, saying what to do instead.
void check_fused_context(const ExecContext& ctx, const char* kernel) {
  if (ctx.backend != Backend::cuda)
    throw Error(what(kernel, "context") +
                ": fused attention runs only on the CUDA back end (cuDNN SDPA), not on the " +
                std::string(tensor::backend_name(ctx.backend)) +
                " back end; ask fused_attention_supported() and use the unfused path "
                "(gemm + causal_softmax) where it says false");
  check_backend(ctx, kernel);
#if !DSTRAIN_KERNELS_FUSED_ATTENTION
  throw Error(what(kernel, "context") +
              ": this build has no cuDNN, so no fused attention (CMake found no cuDNN 9: see "
              "its 'dstrain: cuDNN' line); use the unfused path");
#endif
  if (ctx.math != DType::bf16 && ctx.math != DType::f16)
    throw Error(what(kernel, "ctx.math") +
                " must be bf16 or f16 for fused attention (cuDNN SDPA has no f32 path), got " +
                std::string(dtype_name(ctx.math)));
}

/// q (B, T, H, D), k and v (B, T, KV, D), all f32 on the back end's device, H a multiple of KV.
AttentionDims attention_dims(const ExecContext& ctx, const char* kernel, const Tensor& q,
                             const Tensor& k, const Tensor& v) {
  if (q.shape.rank != 4 || q.dtype != DType::f32)
    throw Error(what(kernel, "q") + ": expected f32 (B, T, H, D), got " +
                std::string(dtype_name(q.dtype)) + " " + q.shape.str());
  if (k.shape.rank != 4 || k.dtype != DType::f32)
    throw Error(what(kernel, "k") + ": expected f32 (B, T, KV, D), got " +
                std::string(dtype_name(k.dtype)) + " " + k.shape.str());
  const AttentionDims a{q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3]};
  expect(ctx, q, q.shape, DType::f32, kernel, "q");
  expect(ctx, k, Shape{a.b, a.t, a.kv, a.d}, DType::f32, kernel, "k");
  expect(ctx, v, Shape{a.b, a.t, a.kv, a.d}, DType::f32, kernel, "v");
  if (a.h > 0 && (a.kv == 0 || a.h % a.kv != 0))
    throw Error(what(kernel, "k") + ": query heads H = " + std::to_string(a.h) +
                " must be a multiple of key/value heads KV = " + std::to_string(a.kv));
  return a;
}

void check_attention_scale(const char* kernel, float scale) {
  if (!std::isfinite(scale))
    throw Error(what(kernel, "scale") + " must be finite, got " + std::to_string(scale));
}

#if DSTRAIN_KERNELS_FUSED_ATTENTION
cuda_backend::FusedAttentionShape fused_shape(const ExecContext& ctx, const AttentionDims& a) {
  return {a.b, a.t, a.h, a.kv, a.d, ctx.math == DType::f16};
}

/// Throws with cuDNN's reason when the back end cannot run the shape (never launches then).
void require_supported(const char* kernel, const cuda_backend::FusedAttentionShape& s) {
  std::string why;
  if (!cuda_backend::fused_attention_supported(s, &why))
    throw Error(what(kernel, "shape") + " B=" + std::to_string(s.b) + " T=" + std::to_string(s.t) +
                " H=" + std::to_string(s.h) + " KV=" + std::to_string(s.kv) +
                " D=" + std::to_string(s.d) + " is not supported by cuDNN here: " + why);
}
#endif

}  // namespace

bool fused_attention_supported(const ExecContext& ctx, std::int64_t B, std::int64_t T,
                               std::int64_t H, std::int64_t KV, std::int64_t D) {
#if DSTRAIN_KERNELS_FUSED_ATTENTION
  if (ctx.backend != Backend::cuda) return false;
  if (ctx.math != DType::bf16 && ctx.math != DType::f16) return false;
  if (B < 1 || T < 1 || H < 1 || KV < 1 || D < 1 || H % KV != 0) return false;
  return cuda_backend::fused_attention_supported({B, T, H, KV, D, ctx.math == DType::f16}, nullptr);
#else
  (void)ctx, (void)B, (void)T, (void)H, (void)KV, (void)D;
  return false;
#endif
}

void fused_attention_forward(const ExecContext& ctx, const Tensor& q, const Tensor& k,
                             const Tensor& v, float scale, const Tensor& out, const Tensor& stats) {
  constexpr const char* name = "fused_attention_forward";
  check_fused_context(ctx, name);
  const AttentionDims a = attention_dims(ctx, name, q, k, v);
  expect(ctx, out, q.shape, DType::f32, name, "out");
  expect(ctx, stats, Shape{a.b, a.h, a.t}, DType::f32, name, "stats");
  check_attention_scale(name, scale);
  if (a.b * a.t * a.h == 0) return;
#if DSTRAIN_KERNELS_FUSED_ATTENTION
  const cuda_backend::FusedAttentionShape s = fused_shape(ctx, a);
  require_supported(name, s);
  cuda_backend::fused_attention_forward(
      ctx.stream, {q.ptr<float>(), k.ptr<float>(), v.ptr<float>(), scale, out.ptr<float>(),
                   stats.ptr<float>(), s});
#endif
}

void fused_attention_backward(const ExecContext& ctx, const Tensor& q, const Tensor& k,
                              const Tensor& v, const Tensor& out, const Tensor& dout,
                              const Tensor& stats, float scale, const Tensor& dq, const Tensor& dk,
                              const Tensor& dv) {
  constexpr const char* name = "fused_attention_backward";
  check_fused_context(ctx, name);
  const AttentionDims a = attention_dims(ctx, name, q, k, v);
  expect(ctx, out, q.shape, DType::f32, name, "out");
  expect(ctx, dout, q.shape, DType::f32, name, "dout");
  expect(ctx, stats, Shape{a.b, a.h, a.t}, DType::f32, name, "stats");
  expect(ctx, dq, q.shape, DType::f32, name, "dq");
  expect(ctx, dk, k.shape, DType::f32, name, "dk");
  expect(ctx, dv, k.shape, DType::f32, name, "dv");
  check_attention_scale(name, scale);
  if (a.b * a.t * a.h == 0) return;
#if DSTRAIN_KERNELS_FUSED_ATTENTION
  const cuda_backend::FusedAttentionShape s = fused_shape(ctx, a);
  require_supported(name, s);
  cuda_backend::fused_attention_backward(
      ctx.stream,
      {q.ptr<float>(), k.ptr<float>(), v.ptr<float>(), out.ptr<float>(), dout.ptr<float>(),
       stats.ptr<float>(), scale, dq.ptr<float>(), dk.ptr<float>(), dv.ptr<float>(), s});
#endif
}

}  // namespace dst::kernels
