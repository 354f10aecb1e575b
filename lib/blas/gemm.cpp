/// \file gemm.cpp
/// Argument checks, back-end dispatch and the host (OpenBLAS CBLAS) back end of gemm.hpp;
/// the CUDA back end (cuBLASLt) is cublaslt_gemm.cpp.
/// Every check happens here, before any back end runs, so both back ends reject the same
/// calls with the same messages and a vendor library never sees a bad argument (OpenBLAS
/// would print an xerbla line and silently return; cuBLAS would return a status code).
#include "blas/gemm.hpp"
#include "blas/host_blas.hpp"
#include "blas/own_gemm.hpp"

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <sstream>
#include <string>

#include "core/error.hpp"

#if defined(DSTRAIN_HAVE_CUDA) && DSTRAIN_HAVE_CUDA
#include "blas/detail/cublaslt_gemm.hpp"
#define DST_BLAS_CUDA 1
#else
#define DST_BLAS_CUDA 0
#endif

namespace dst::blas {

namespace detail {
namespace {

using tensor::Backend;
using tensor::Device;
using tensor::ExecContext;
using tensor::Tensor;

/// One stored operand: `rows` x `cols` as it lies in memory (before op()).
struct Operand {
  const char* name;     // "A", "B", "C"
  const char* ld_name;  // "lda", ...
  const void* ptr;
  std::int64_t rows;
  std::int64_t cols;
  std::int64_t ld;
};

[[noreturn]] void fail(const char* call, const std::string& msg) {
  throw Error(std::string(call) + ": " + msg);
}

void check_dim(const char* call, const char* name, std::int64_t v) {
  if (v < 0) fail(call, std::string(name) + " = " + std::to_string(v) + " must be >= 0");
}

// `used`: false when the product is empty (M or N is 0) and no operand is touched.
void check_operand(const char* call, const Operand& op, bool used) {
  if (op.ld < op.cols) {
    std::ostringstream os;
    os << op.ld_name << " = " << op.ld << " is smaller than the row length " << op.cols << " of "
       << op.name << " as stored (" << op.rows << " x " << op.cols << ", row-major)";
    fail(call, os.str());
  }
  if (used && op.ptr == nullptr && op.rows > 0 && op.cols > 0) {
    std::ostringstream os;
    os << op.name << " is a null pointer but has " << op.rows << " x " << op.cols << " elements";
    fail(call, os.str());
  }
}

// Elements spanned by one stored operand, from its first to its last element.
std::int64_t span_of(const Operand& op) {
  return op.rows > 0 && op.cols > 0 ? (op.rows - 1) * op.ld + op.cols : 0;
}

struct GemmOperands {
  Operand a, b, c;
};

GemmOperands check_gemm(const char* call, Trans ta, Trans tb, std::int64_t m, std::int64_t n,
                        std::int64_t k, const float* a, std::int64_t lda, const float* b,
                        std::int64_t ldb, const float* c, std::int64_t ldc) {
  check_dim(call, "m", m);
  check_dim(call, "n", n);
  check_dim(call, "k", k);
  // As stored: A is (M, K), or (K, M) when transposed; B is (K, N), or (N, K).
  const GemmOperands ops{{"A", "lda", a, ta == Trans::no ? m : k, ta == Trans::no ? k : m, lda},
                         {"B", "ldb", b, tb == Trans::no ? k : n, tb == Trans::no ? n : k, ldb},
                         {"C", "ldc", c, m, n, ldc}};
  const bool used = m > 0 && n > 0;
  check_operand(call, ops.a, used);
  check_operand(call, ops.b, used);
  check_operand(call, ops.c, used);
  return ops;
}

void check_batch(const char* call, const GemmOperands& ops, std::int64_t stride_a,
                 std::int64_t stride_b, std::int64_t stride_c, std::int64_t batch) {
  check_dim(call, "batch", batch);
  check_dim(call, "stride_a", stride_a);
  check_dim(call, "stride_b", stride_b);
  check_dim(call, "stride_c", stride_c);
  // A and B may be shared across the batch (stride 0), but outputs must not overlap: the
  // host loop would make later products overwrite earlier ones, and cuBLAS leaves
  // overlapping outputs undefined.
  const std::int64_t c_span = span_of(ops.c);
  if (batch > 1 && stride_c < c_span) {
    std::ostringstream os;
    os << "stride_c = " << stride_c << " makes the C matrices overlap (each spans " << c_span
       << " elements: (M - 1) * ldc + N)";
    fail(call, os.str());
  }
}

// OpenBLAS as packaged by Debian uses 32-bit blasint (no OPENBLAS_USE64BITINT).
void check_blasint(const char* call, const char* name, std::int64_t v) {
  if (v > static_cast<std::int64_t>(INT_MAX))
    fail(call, std::string(name) + " = " + std::to_string(v) +
                   " exceeds the 32-bit integer range of the host BLAS (OpenBLAS)");
}

CBLAS_TRANSPOSE cblas_trans(Trans t) {
  return t == Trans::no ? CblasNoTrans : CblasTrans;
}

// CBLAS demands ld >= max(1, row length) even for empty rows; validated ld >= row length.
int cblas_ld(std::int64_t ld) {
  return static_cast<int>(std::max<std::int64_t>(ld, 1));
}

void host_gemm(const char* call, Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k,
               float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
               float beta, float* c, std::int64_t ldc) {
  check_blasint(call, "m", m);
  check_blasint(call, "n", n);
  check_blasint(call, "k", k);
  check_blasint(call, "lda", lda);
  check_blasint(call, "ldb", ldb);
  check_blasint(call, "ldc", ldc);
  // k == 0 is handed on: OpenBLAS then computes C = beta * C (beta == 0 writes zeros
  // without reading C, as BLAS specifies).
  cblas_sgemm(CblasRowMajor, cblas_trans(ta), cblas_trans(tb), static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), alpha, a, cblas_ld(lda), b, cblas_ld(ldb),
              beta, c, cblas_ld(ldc));
}

// ---- who runs a host product (ExecContext::host_gemm) -------------------------------

bool own_kernels_required(const char* call, const ExecContext& ctx) {
  if (ctx.host_gemm != tensor::HostGemm::own) return false;
  if (!own_gemm_supported())
    fail(call,
         "kernels.host_gemm is 'dstrain' but this CPU has no AVX-512F, which dstrain's own "
         "kernels need: use 'auto' or 'blas'");
  return true;
}

// Attention's small products: dstrain's kernel wherever the CPU has AVX-512F (OpenBLAS
// threads do not help products this small).
bool own_small_products(const char* call, const ExecContext& ctx) {
  if (ctx.backend != Backend::kokkos || ctx.host_gemm == tensor::HostGemm::blas) return false;
  return own_kernels_required(call, ctx) || own_gemm_supported();
}

// The dense layers' products: under `own` all of them in dstrain's kernel. Under
// `automatic` the forward and input-gradient products (C written, or accumulated over a
// short k) but not the weight gradients (dW += dy^T x, k = the micro-batch's tokens): OpenBLAS
// clears C before a beta = 0 product and dstrain's kernel does not, which is where it wins;
// a weight gradient accumulates (beta = 1, nothing cleared), and there OpenBLAS was the
// faster (BM_layer_product_paired, docs/performance.md). And only while the host BLAS
// computes on one thread, as dstrain's kernel does (the CPU layout: one rank per core): a
// user who gives OpenBLAS threads (OPENBLAS_NUM_THREADS) keeps them.
bool own_layer_products(const char* call, const ExecContext& ctx, bool weight_gradient) {
  if (ctx.backend != Backend::kokkos || ctx.host_gemm == tensor::HostGemm::blas) return false;
  if (own_kernels_required(call, ctx)) return true;
  return !weight_gradient && own_gemm_supported() && host_blas_threads() <= 1;
}

// The dense layers' products: C = op(A) op(B) (+ C) with alpha = 1, checked by the caller.
void layer_product(const char* call, const ExecContext& ctx, bool weight_gradient, Trans ta,
                   Trans tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                   std::int64_t lda, const float* b, std::int64_t ldb, bool accumulate, float* c,
                   std::int64_t ldc) {
  if (own_layer_products(call, ctx, weight_gradient)) {
    check_gemm(call, ta, tb, m, n, k, a, lda, b, ldb, c, ldc);
    blocked_gemm(ta, tb, m, n, k, a, lda, b, ldb, accumulate, c, ldc);
    return;
  }
  gemm(ctx, ta, tb, m, n, k, 1.0F, a, lda, b, ldb, accumulate ? 1.0F : 0.0F, c, ldc);
}

#if !DST_BLAS_CUDA
[[noreturn]] void no_cuda(const char* call) {
  fail(call,
       "the CUDA back end is not built (configure with -DDSTRAIN_ENABLE_CUDA=ON) but the "
       "execution context asks for backend 'cuda'");
}
#endif

// ---- linear layers ----------------------------------------------------------------

// Product of all but the last dimension: the rows a dense layer sees.
std::int64_t leading_rows(const tensor::Shape& s) {
  std::int64_t r = 1;
  for (int i = 0; i + 1 < s.rank; ++i)
    r *= s[i];
  return r;
}

std::int64_t last_dim(const tensor::Shape& s) {
  return s.rank > 0 ? s[s.rank - 1] : 1;
}

Device device_of(Backend b) {
  return b == Backend::cuda ? Device::cuda : Device::host;
}

void check_linear_tensor(const char* call, const char* name, const Tensor& t,
                         const ExecContext& ctx) {
  if (t.dtype != DType::f32)
    fail(call, std::string(name) + " must be f32, got " + std::string(dtype_name(t.dtype)) + " " +
                   t.shape.str());
  if (t.empty() && t.numel() > 0)
    fail(call, std::string(name) + " " + t.shape.str() + " has no data (null pointer)");
  if (t.shape.rank < 1)
    fail(call, std::string(name) + " must have at least one dimension, got a scalar");
  if (t.device != device_of(ctx.backend))
    fail(call, std::string(name) + " lives in " +
                   (t.device == Device::cuda ? "CUDA device" : "host") +
                   " memory but the execution context's back end is '" +
                   std::string(tensor::backend_name(ctx.backend)) + "'");
}

// y must have x's leading dimensions and `last` as its last one.
void check_rows_like(const char* call, const char* name, const Tensor& t, const char* ref_name,
                     const Tensor& ref, std::int64_t last) {
  bool ok = t.shape.rank == ref.shape.rank && last_dim(t.shape) == last;
  for (int i = 0; ok && i + 1 < t.shape.rank; ++i)
    ok = t.shape[i] == ref.shape[i];
  if (!ok) {
    std::ostringstream os;
    os << name << " has shape " << t.shape.str() << " but " << ref_name << " " << ref.shape.str()
       << " needs " << name << " = (" << ref_name << "'s leading dimensions, " << last << ")";
    fail(call, os.str());
  }
}

// Writing a product into memory it reads gives garbage on every back end.
void check_disjoint(const char* call, const char* out_name, const Tensor& out, const char* in_name,
                    const Tensor& in) {
  if (out.empty() || in.empty() || out.bytes() == 0 || in.bytes() == 0) return;
  const auto o0 = reinterpret_cast<std::uintptr_t>(out.data);
  const auto i0 = reinterpret_cast<std::uintptr_t>(in.data);
  if (o0 < i0 + in.bytes() && i0 < o0 + out.bytes())
    fail(call, std::string(out_name) + " overlaps " + in_name + " in memory");
}

// t's last dimension must be w's dimension `w_dim` (0: out, 1: in).
void check_last_dim(const char* call, const char* name, const Tensor& t, const Tensor& w,
                    int w_dim) {
  if (last_dim(t.shape) != w.shape[w_dim]) {
    std::ostringstream os;
    os << name << " has shape " << t.shape.str() << " but w " << w.shape.str()
       << " needs its last dimension to be " << (w_dim == 0 ? "out" : "in") << " = "
       << w.shape[w_dim];
    fail(call, os.str());
  }
}

void check_weight(const char* call, const Tensor& w, const ExecContext& ctx) {
  check_linear_tensor(call, "w", w, ctx);
  if (w.shape.rank != 2) fail(call, "w must be (out, in), got " + w.shape.str());
}

}  // namespace
}  // namespace detail

void gemm(const tensor::ExecContext& ctx, Trans ta, Trans tb, std::int64_t m, std::int64_t n,
          std::int64_t k, float alpha, const float* a, std::int64_t lda, const float* b,
          std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  constexpr const char* kCall = "blas::gemm";
  detail::check_gemm(kCall, ta, tb, m, n, k, a, lda, b, ldb, c, ldc);
  if (ctx.backend == tensor::Backend::cuda) {
#if DST_BLAS_CUDA
    if (m == 0 || n == 0) return;
    // ctx.math picks the precision of the products (f32, or bf16 / f16 tensor cores).
    detail::cublaslt_gemm(ctx.stream, ctx.math, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c,
                          ldc);
    return;
#else
    detail::no_cuda(kCall);
#endif
  }
  if (m == 0 || n == 0) return;
  detail::host_gemm(kCall, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm_strided_batched(const tensor::ExecContext& ctx, Trans ta, Trans tb, std::int64_t m,
                          std::int64_t n, std::int64_t k, float alpha, const float* a,
                          std::int64_t lda, std::int64_t stride_a, const float* b, std::int64_t ldb,
                          std::int64_t stride_b, float beta, float* c, std::int64_t ldc,
                          std::int64_t stride_c, std::int64_t batch) {
  constexpr const char* kCall = "blas::gemm_strided_batched";
  const auto ops = detail::check_gemm(kCall, ta, tb, m, n, k, a, lda, b, ldb, c, ldc);
  detail::check_batch(kCall, ops, stride_a, stride_b, stride_c, batch);
  if (ctx.backend == tensor::Backend::cuda) {
#if DST_BLAS_CUDA
    if (m == 0 || n == 0 || batch == 0) return;
    detail::cublaslt_gemm_strided_batched(ctx.stream, ctx.math, ta, tb, m, n, k, alpha, a, lda,
                                          stride_a, b, ldb, stride_b, beta, c, ldc, stride_c,
                                          batch);
    return;
#else
    detail::no_cuda(kCall);
#endif
  }
  if (m == 0 || n == 0) return;
  // A loop of single products: OpenBLAS 0.3.21 (Debian 12) has no batched CBLAS entry
  // (cblas_?gemm_batch came later; the strided form only in 0.3.31), and each product
  // here (one attention head: T x T x head_dim) is large enough for OpenBLAS to use its
  // threads inside it, so a batched entry would mostly save call overhead.
  for (std::int64_t i = 0; i < batch; ++i)
    detail::host_gemm(kCall, ta, tb, m, n, k, alpha, a + i * stride_a, lda, b + i * stride_b, ldb,
                      beta, c + i * stride_c, ldc);
}

void small_gemm_strided_batched(const tensor::ExecContext& ctx, Trans ta, Trans tb, std::int64_t m,
                                std::int64_t n, std::int64_t k, const float* a, std::int64_t lda,
                                std::int64_t stride_a, const float* b, std::int64_t ldb,
                                std::int64_t stride_b, bool accumulate, float* c, std::int64_t ldc,
                                std::int64_t stride_c, std::int64_t batch) {
  constexpr const char* kCall = "blas::small_gemm_strided_batched";
  const auto ops = detail::check_gemm(kCall, ta, tb, m, n, k, a, lda, b, ldb, c, ldc);
  detail::check_batch(kCall, ops, stride_a, stride_b, stride_c, batch);
  if (!detail::own_small_products(kCall, ctx)) {
    gemm_strided_batched(ctx, ta, tb, m, n, k, 1.0F, a, lda, stride_a, b, ldb, stride_b,
                         accumulate ? 1.0F : 0.0F, c, ldc, stride_c, batch);
    return;
  }
  for (std::int64_t i = 0; i < batch; ++i)
    small_gemm(ta, tb, m, n, k, a + i * stride_a, lda, b + i * stride_b, ldb, accumulate,
               c + i * stride_c, ldc);
}

void linear_forward(const tensor::ExecContext& ctx, const tensor::Tensor& x,
                    const tensor::Tensor& w, const tensor::Tensor& y) {
  constexpr const char* kCall = "blas::linear_forward";
  detail::check_weight(kCall, w, ctx);
  detail::check_linear_tensor(kCall, "x", x, ctx);
  detail::check_linear_tensor(kCall, "y", y, ctx);
  const std::int64_t out = w.shape[0];
  const std::int64_t in = w.shape[1];
  detail::check_last_dim(kCall, "x", x, w, 1);
  detail::check_rows_like(kCall, "y", y, "x", x, out);
  detail::check_disjoint(kCall, "y", y, "x", x);
  detail::check_disjoint(kCall, "y", y, "w", w);
  const std::int64_t rows = detail::leading_rows(x.shape);
  // y (N, out) = x (N, in) * W^T, W (out, in)
  detail::layer_product(kCall, ctx, false, Trans::no, Trans::yes, rows, out, in, x.ptr<float>(), in,
                        w.ptr<float>(), in, false, y.ptr<float>(), out);
}

void linear_backward(const tensor::ExecContext& ctx, const tensor::Tensor& dy,
                     const tensor::Tensor& x, const tensor::Tensor& w, const tensor::Tensor& dx,
                     const tensor::Tensor& dw, bool accumulate_dx) {
  constexpr const char* kCall = "blas::linear_backward";
  detail::check_weight(kCall, w, ctx);
  detail::check_linear_tensor(kCall, "dy", dy, ctx);
  const std::int64_t out = w.shape[0];
  const std::int64_t in = w.shape[1];
  detail::check_last_dim(kCall, "dy", dy, w, 0);
  const std::int64_t rows = detail::leading_rows(dy.shape);

  if (!dx.empty()) {
    detail::check_linear_tensor(kCall, "dx", dx, ctx);
    detail::check_rows_like(kCall, "dx", dx, "dy", dy, in);
    detail::check_disjoint(kCall, "dx", dx, "dy", dy);
    detail::check_disjoint(kCall, "dx", dx, "w", w);
    // dx (N, in) = dy (N, out) * W (out, in)
    detail::layer_product(kCall, ctx, false, Trans::no, Trans::no, rows, in, out, dy.ptr<float>(),
                          out, w.ptr<float>(), in, accumulate_dx, dx.ptr<float>(), in);
  }
  if (!dw.empty()) {
    detail::check_linear_tensor(kCall, "x", x, ctx);
    detail::check_rows_like(kCall, "x", x, "dy", dy, in);
    detail::check_linear_tensor(kCall, "dw", dw, ctx);
    if (dw.shape != w.shape)
      detail::fail(kCall, "dw has shape " + dw.shape.str() + " but w is " + w.shape.str());
    detail::check_disjoint(kCall, "dw", dw, "dy", dy);
    detail::check_disjoint(kCall, "dw", dw, "x", x);
    // dW (out, in) += dy^T (out, N) * x (N, in)
    detail::layer_product(kCall, ctx, true, Trans::yes, Trans::no, out, in, rows, dy.ptr<float>(),
                          out, x.ptr<float>(), in, true, dw.ptr<float>(), in);
  }
}

std::string describe_host_products(const tensor::ExecContext& ctx) {
  constexpr const char* kCall = "blas::describe_host_products";
  if (ctx.backend != tensor::Backend::kokkos) return "on the device (cuBLASLt)";
  const std::string own = "dstrain's AVX-512 kernel";
  const int threads = host_blas_threads();
  const std::string blas =
      "the host BLAS" +
      (threads > 1 ? " (" + std::to_string(threads) + " threads)" : std::string());
  const std::string layers = detail::own_layer_products(kCall, ctx, false) ? own : blas;
  const std::string grads = detail::own_layer_products(kCall, ctx, true) ? own : blas;
  return "dense layers: " +
         (layers == grads
              ? layers
              : layers + " (forward, input gradients), " + grads + " (weight gradients)") +
         "; attention: " + (detail::own_small_products(kCall, ctx) ? own : blas);
}

}  // namespace dst::blas
