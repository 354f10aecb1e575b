/// \file cublaslt_gemm.cpp
/// cuBLASLt back end of gemm.hpp (CUDA builds only). Host code: it only enqueues cuBLASLt
/// calls on the context's stream, so it is compiled by the C++ compiler, not nvcc.
///
/// Numerics (ExecContext::math; A, B and C are fp32 in memory in every mode):
///   f32   CUBLAS_COMPUTE_32F: a "default" compute type, which cublas_api.h defines as
///         keeping internal storage of at least the stated precision, so true fp32 products
///         (TF32 needs CUBLAS_COMPUTE_32F_FAST_TF32, which is never used). That keeps the
///         CUDA back end within fp32 rounding of the host reference.
///   bf16  A and B are narrowed to bf16 (round to nearest even, cuda_narrow.cu) into the
///         handle's operand space, then multiplied as CUDA_R_16BF inputs with
///         CUBLAS_COMPUTE_32F (fp32 accumulation, fp32 C). The model stores values already
///         rounded to bf16 in the fp32 buffers, which narrow exactly, so the only rounding
///         left is the accumulation's. Measured on an H200 at 8192^3 (docs/gpu.md): 16-bit
///         inputs run at 780-790 TFLOP/s, fp32 inputs with CUBLAS_COMPUTE_32F_FAST_16BF
///         (cuBLASLt narrowing inside the product) at 424-427; the narrowing pass reads
///         4 and writes 2 bytes per operand element.
///   f16   the same with IEEE half (CUDA_R_16F).
/// Scale type (alpha, beta) is CUDA_R_32F; C/D are CUDA_R_32F in every mode.
///
/// Operand space: per (thread, device) handle, one device buffer holding both narrowed
/// operands of the product being enqueued, grown (by a quarter more than asked, stream
/// ordered: cudaFreeAsync / cudaMallocAsync) when a product needs more. Products on one
/// handle are ordered (bind()), so one buffer serves them all. Its size is the largest
/// product's two operands in 16 bits (deepseek-1b at micro-batch 4 x 2048: the output
/// head's weight gradient, 2 x 8192 x 102400 + ..., about 1.7 GB); it is not the model's
/// allocator's memory, so peak_mem_bytes does not count it (nvidia-smi does).
///
/// Plans: the first product of a shape builds the matmul descriptor and the three layouts
/// and asks cublasLtMatmulAlgoGetHeuristic for the best algorithm once; the plan is cached
/// per (thread, device) under everything the algorithm choice may depend on (PlanKey) and
/// reused by every later call of that shape. If the heuristic returns no algorithm the call
/// throws dst::Error naming the shape and the math mode.
///
/// Determinism: the heuristic is asked only for algorithms without split-K reduction
/// (CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK = CUBLASLT_REDUCTION_SCHEME_NONE, "the
/// dot-product shall be performed in one sequence", cublasLt.h), the algorithm of a shape is
/// fixed by the cache for the life of the thread, and the workspace is ours (the cuBLAS
/// guide's "Results reproducibility" names a user-owned cublasLtMatmul workspace as one way
/// to keep results reproducible with several streams). cuBLAS states bitwise
/// reproducibility per toolkit version on GPUs of the same architecture and SM count;
/// across toolkits or GPU models results may differ by rounding. blas_cuda_test checks
/// "same call twice, same bits".
///
/// Workspace: kCublasLtWorkspaceBytes per (thread, device), cudaMalloc'd when the handle is
/// made and passed as CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES. One workspace serves every
/// stream the thread uses: when the stream changes, the new stream waits for the old one
/// (an event), so two products never use it at once. A stream handed to this back end must
/// therefore stay valid until the thread's next product on another stream is enqueued.
///
/// Epilogues: none (CUBLASLT_EPILOGUE_DEFAULT). A bias or activation would fuse into the
/// product through CUBLASLT_MATMUL_DESC_EPILOGUE (and _BIAS_POINTER), as part of PlanKey.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <climits>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "blas/detail/cublaslt_gemm.hpp"
#include "blas/detail/cuda_narrow.hpp"
#include "core/error.hpp"

/// Throws dst::Error naming the cuBLAS status, the call and file:line unless `call`
/// returns CUBLAS_STATUS_SUCCESS.
#define DST_CUBLAS_CHECK(call)                                                                    \
  do {                                                                                            \
    const cublasStatus_t dst_cublas_status_ = (call);                                             \
    if (dst_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                              \
      throw ::dst::Error(std::string("blas: ") + cublasLtGetStatusName(dst_cublas_status_) +      \
                         " (" + cublasLtGetStatusString(dst_cublas_status_) + ") from " + #call + \
                         " [" + __FILE__ + ":" + std::to_string(__LINE__) + "]");                 \
  } while (0)

/// The same for CUDA runtime calls.
#define DST_CUDA_CHECK(call)                                                                 \
  do {                                                                                       \
    const cudaError_t dst_cuda_status_ = (call);                                             \
    if (dst_cuda_status_ != cudaSuccess)                                                     \
      throw ::dst::Error(std::string("blas: ") + cudaGetErrorName(dst_cuda_status_) + " (" + \
                         cudaGetErrorString(dst_cuda_status_) + ") from " + #call + " [" +   \
                         __FILE__ + ":" + std::to_string(__LINE__) + "]");                   \
  } while (0)

namespace dst::blas::detail {

namespace {

// ---- descriptors, owned -------------------------------------------------------------------

struct MatmulDescDeleter {
  void operator()(cublasLtMatmulDesc_t d) const noexcept { cublasLtMatmulDescDestroy(d); }
};
struct LayoutDeleter {
  void operator()(cublasLtMatrixLayout_t l) const noexcept { cublasLtMatrixLayoutDestroy(l); }
};
struct PreferenceDeleter {
  void operator()(cublasLtMatmulPreference_t p) const noexcept {
    cublasLtMatmulPreferenceDestroy(p);
  }
};
using MatmulDesc = std::unique_ptr<cublasLtMatmulDescOpaque_t, MatmulDescDeleter>;
using Layout = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, LayoutDeleter>;
using Preference = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, PreferenceDeleter>;

template <class T>
void set_attr(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& value) {
  DST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &value, sizeof value));
}
template <class T>
void set_attr(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr, const T& value) {
  DST_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, attr, &value, sizeof value));
}
template <class T>
void set_attr(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr,
              const T& value) {
  DST_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(p, attr, &value, sizeof value));
}

// ---- math modes -----------------------------------------------------------------------------

cublasComputeType_t compute_type(const char* call, DType math) {
  switch (math) {
    case DType::f32:
      return CUBLAS_COMPUTE_32F;
    case DType::bf16:
    case DType::f16:
      return CUBLAS_COMPUTE_32F;  // with 16-bit A and B (operand_type)
    default:
      break;
  }
  throw Error(std::string(call) + ": the execution context's math mode '" +
              std::string(dtype_name(math)) +
              "' is not a matrix-product precision of the cuBLASLt back end (f32, bf16, f16)");
}

const char* compute_type_name(DType math) {
  switch (math) {
    case DType::bf16:
      return "CUBLAS_COMPUTE_32F, A and B narrowed to bf16";
    case DType::f16:
      return "CUBLAS_COMPUTE_32F, A and B narrowed to f16";
    default:
      return "CUBLAS_COMPUTE_32F";
  }
}

/// The element type A and B are multiplied in: fp32 as stored, or narrowed to 16 bits.
cudaDataType_t operand_type(DType math) {
  switch (math) {
    case DType::bf16:
      return CUDA_R_16BF;
    case DType::f16:
      return CUDA_R_16F;
    default:
      return CUDA_R_32F;
  }
}

std::int64_t operand_bytes(DType math) {
  return math == DType::f32 ? 4 : 2;
}

// cublasLt.h: layout rows and columns are "usually" supported only as int32 values, and the
// batch count is an int32_t attribute.
void check_int32(const char* call, const char* name, std::int64_t v) {
  if (v > static_cast<std::int64_t>(INT_MAX))
    throw Error(std::string(call) + ": " + name + " = " + std::to_string(v) +
                " exceeds the 32-bit range cuBLASLt supports for matrix sizes and batch counts");
}

// ---- plans ----------------------------------------------------------------------------------

// Alignment in bytes of an operand: the largest power of two up to 16 that divides its
// address and, for batches, its batch stride in bytes (every matrix of the batch must have
// it). 16 bytes is the widest vector access, and what Hopper's TMA asks of a global
// address; going up to the 256 bytes cuBLASLt assumes by default would multiply the plans
// of one shape by up to five for the offsets of views into flat buffers.
std::uint32_t alignment_of(const void* p, std::int64_t stride, std::int64_t batch,
                           std::int64_t element_bytes = sizeof(float)) {
  auto bits = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p));
  if (batch > 1) bits |= static_cast<std::uint64_t>(stride * element_bytes);
  std::uint32_t a = 16;
  while (a > 1 && bits % a != 0)
    a /= 2;
  return a;
}

/// Everything the algorithm choice may depend on, in gemm.hpp's row-major terms. For a
/// single product (batch 1) the strides are 0, so gemm and a batch of one share plans.
struct PlanKey {
  Trans ta, tb;
  std::int64_t m, n, k, lda, ldb, ldc;
  std::int64_t stride_a, stride_b, stride_c, batch;
  DType math;
  bool beta_zero;
  std::uint32_t align_a, align_b, align_c;

  auto tied() const {
    return std::tie(ta, tb, m, n, k, lda, ldb, ldc, stride_a, stride_b, stride_c, batch, math,
                    beta_zero, align_a, align_b, align_c);
  }
  bool operator<(const PlanKey& o) const { return tied() < o.tied(); }

  std::string str() const {
    std::ostringstream os;
    os << "C (" << m << " x " << n << ") = op(A) op(B) with K = " << k
       << ", ta = " << (ta == Trans::no ? "no" : "yes")
       << ", tb = " << (tb == Trans::no ? "no" : "yes") << ", lda = " << lda << ", ldb = " << ldb
       << ", ldc = " << ldc;
    if (batch > 1)
      os << ", batch = " << batch << " (strides " << stride_a << ", " << stride_b << ", "
         << stride_c << ")";
    os << ", beta " << (beta_zero ? "== 0" : "!= 0") << ", alignment of A, B, C = " << align_a
       << ", " << align_b << ", " << align_c << " bytes, math " << dtype_name(math) << " ("
       << compute_type_name(math) << ")";
    return os.str();
  }
};

cublasOperation_t op_of(Trans t) {
  return t == Trans::no ? CUBLAS_OP_N : CUBLAS_OP_T;
}

/// One column-major layout of `type` elements, batched when batch > 1.
Layout make_layout(cudaDataType_t type, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                   std::int64_t batch, std::int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  DST_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, type, static_cast<std::uint64_t>(rows),
                                              static_cast<std::uint64_t>(cols), ld));
  Layout owned(l);
  if (batch > 1) {
    set_attr(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, static_cast<std::int32_t>(batch));
    set_attr(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, stride);
  }
  return owned;
}

/// A matmul descriptor, the layouts and the algorithm chosen for one PlanKey.
///
/// Row-major C (M, N) is column-major C^T (N, M) with the same ldc, and likewise for A and
/// B, so C^T = op(B)^T op(A)^T is one column-major product with the operands swapped:
/// (transa, transb) = (tb, ta), (m, n) = (N, M), A' = B (ldb), B' = A (lda). This is the
/// only place that swap happens.
class Plan {
 public:
  Plan(cublasLtHandle_t handle, const PlanKey& key, const char* call) {
    cublasLtMatmulDesc_t d = nullptr;
    DST_CUBLAS_CHECK(cublasLtMatmulDescCreate(&d, compute_type(call, key.math), CUDA_R_32F));
    desc_.reset(d);
    set_attr(d, CUBLASLT_MATMUL_DESC_TRANSA, static_cast<std::int32_t>(op_of(key.tb)));
    set_attr(d, CUBLASLT_MATMUL_DESC_TRANSB, static_cast<std::int32_t>(op_of(key.ta)));
    // Pointer mode stays CUBLASLT_POINTER_MODE_HOST (the default): alpha, beta are floats
    // on the host. The epilogue stays CUBLASLT_EPILOGUE_DEFAULT.

    // As stored, row-major: A is (M, K) or, transposed, (K, M); B is (K, N) or (N, K).
    // Column-major, each is its row-major shape reversed.
    const std::int64_t a_rows = key.ta == Trans::no ? key.m : key.k;
    const std::int64_t a_cols = key.ta == Trans::no ? key.k : key.m;
    const std::int64_t b_rows = key.tb == Trans::no ? key.k : key.n;
    const std::int64_t b_cols = key.tb == Trans::no ? key.n : key.k;
    const cudaDataType_t in = operand_type(key.math);
    a_swapped_ = make_layout(in, b_cols, b_rows, key.ldb, key.batch, key.stride_b);  // A' = B
    b_swapped_ = make_layout(in, a_cols, a_rows, key.lda, key.batch, key.stride_a);  // B' = A
    c_ = make_layout(CUDA_R_32F, key.n, key.m, key.ldc, key.batch, key.stride_c);    // C' = C^T

    cublasLtMatmulPreference_t p = nullptr;
    DST_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&p));
    const Preference pref(p);
    set_attr(p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
             static_cast<std::uint64_t>(kCublasLtWorkspaceBytes));
    // No split-K: only algorithms that compute each dot product in one sequence.
    set_attr(p, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
             static_cast<std::uint32_t>(CUBLASLT_REDUCTION_SCHEME_NONE));
    // The heuristic assumes 256-byte aligned buffers unless told otherwise.
    set_attr(p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_b);  // A' = B
    set_attr(p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_a);  // B' = A
    set_attr(p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c);
    set_attr(p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c);

    // The first result is the one with the lowest estimated time.
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    const cublasStatus_t status =
        cublasLtMatmulAlgoGetHeuristic(handle, d, a_swapped_.get(), b_swapped_.get(), c_.get(),
                                       c_.get(), p, 1, &result, &returned);
    if (status != CUBLAS_STATUS_SUCCESS || returned < 1 || result.state != CUBLAS_STATUS_SUCCESS)
      throw Error(std::string(call) + ": cuBLASLt has no algorithm for " + key.str() +
                  " (cublasLtMatmulAlgoGetHeuristic: " + cublasLtGetStatusName(status) + ", " +
                  std::to_string(returned) + " result(s)" +
                  (returned > 0 ? std::string(", state ") + cublasLtGetStatusName(result.state)
                                : std::string()) +
                  ")");
    algo_ = result.algo;
  }

  /// D = C = alpha op(A) op(B) + beta C, row-major operands as gemm.hpp takes them.
  /// `a`, `b`: of the plan's operand type (fp32, or the narrowed 16-bit copies).
  void run(cublasLtHandle_t handle, cudaStream_t stream, void* workspace, float alpha,
           const void* a, const void* b, float beta, float* c) const {
    DST_CUBLAS_CHECK(cublasLtMatmul(handle, desc_.get(), &alpha, b, a_swapped_.get(), a,
                                    b_swapped_.get(), &beta, c, c_.get(), c, c_.get(), &algo_,
                                    workspace, kCublasLtWorkspaceBytes, stream));
  }

 private:
  MatmulDesc desc_;
  Layout a_swapped_, b_swapped_, c_;
  cublasLtMatmulAlgo_t algo_{};
};

// ---- handles --------------------------------------------------------------------------------

/// Zeros kept on the device per handle: the operands of the beta-only product (K == 0 or
/// alpha == 0 with beta != 0, 1), which touches C in chunks of at most this many rows and
/// columns. 256 KiB.
constexpr std::int64_t kZeroCount = 65536;

/// The calling thread's cuBLASLt state on one device: handle, workspace, plans.
struct DeviceHandle {
  int device = 0;
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;  // kCublasLtWorkspaceBytes
  float* zeros = nullptr;     // (kZeroCount)
  void* operands = nullptr;   // the narrowed A and B of 16-bit products (operand_space)
  std::size_t operand_bytes = 0;
  cudaEvent_t handoff = nullptr;
  cudaStream_t last_stream = nullptr;
  bool used = false;  // a product was enqueued (on last_stream)
  std::map<PlanKey, std::unique_ptr<Plan>> plans;
  std::uint64_t heuristic_queries = 0;

  DeviceHandle() = default;
  DeviceHandle(const DeviceHandle&) = delete;
  DeviceHandle& operator=(const DeviceHandle&) = delete;
  ~DeviceHandle() {
    // Statuses are ignored: at process exit the CUDA context may already be gone, and
    // nothing useful can be done with a failed release then. Work still queued may use
    // the workspace, so the device is drained before it is freed.
    plans.clear();
    if (cudaSetDevice(device) == cudaSuccess) (void)cudaDeviceSynchronize();
    if (handoff != nullptr) cudaEventDestroy(handoff);
    if (zeros != nullptr) cudaFree(zeros);
    if (operands != nullptr) cudaFree(operands);
    if (workspace != nullptr) cudaFree(workspace);
    if (handle != nullptr) cublasLtDestroy(handle);
    (void)cudaGetLastError();
  }

  /// Orders this product after the previous one when the stream changes: both use the
  /// same workspace.
  void bind(cudaStream_t stream) {
    if (used && stream != last_stream) {
      DST_CUDA_CHECK(cudaEventRecord(handoff, last_stream));
      DST_CUDA_CHECK(cudaStreamWaitEvent(stream, handoff, 0));
    }
    last_stream = stream;
    used = true;
  }

  /// At least `bytes` of operand space, usable on `stream` after bind(stream): a smaller
  /// buffer is released in stream order (work queued on it finishes first) and a quarter
  /// more than asked is allocated, so that a few growing shapes settle quickly.
  void* operand_space(std::size_t bytes, cudaStream_t stream) {
    if (bytes > operand_bytes) {
      if (operands != nullptr) DST_CUDA_CHECK(cudaFreeAsync(operands, stream));
      operands = nullptr;
      operand_bytes = 0;
      const std::size_t grown = bytes + bytes / 4;
      DST_CUDA_CHECK(cudaMallocAsync(&operands, grown, stream));
      operand_bytes = grown;
    }
    return operands;
  }

  const Plan& plan(const PlanKey& key, const char* call) {
    auto it = plans.find(key);
    if (it == plans.end()) {
      ++heuristic_queries;
      it = plans.emplace(key, std::make_unique<Plan>(handle, key, call)).first;
    }
    return *it->second;
  }
};

/// One DeviceHandle per (thread, device): cuBLASLt handles are tied to the device current
/// when they are made, and the plans and workspace are not shared between threads. Made on
/// first use, released when the thread ends.
class HandleCache {
 public:
  DeviceHandle& current() {
    int device = 0;
    DST_CUDA_CHECK(cudaGetDevice(&device));
    if (DeviceHandle* h = find(device)) return *h;
    auto h = std::make_unique<DeviceHandle>();
    h->device = device;
    DST_CUBLAS_CHECK(cublasLtCreate(&h->handle));
    DST_CUDA_CHECK(cudaMalloc(&h->workspace, kCublasLtWorkspaceBytes));
    void* z = nullptr;
    DST_CUDA_CHECK(cudaMalloc(&z, kZeroCount * sizeof(float)));
    h->zeros = static_cast<float*>(z);
    DST_CUDA_CHECK(cudaMemset(h->zeros, 0, kZeroCount * sizeof(float)));  // +0.0f
    // cudaMemset may return before it is done, and a stream made with
    // cudaStreamNonBlocking would not wait for it: finish it here, once. Only the legacy
    // stream it ran on is waited for, not the device: a collective of another stream
    // (NCCL's) may be waiting for a peer that waits for this rank.
    DST_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
    DST_CUDA_CHECK(cudaEventCreateWithFlags(&h->handoff, cudaEventDisableTiming));
    entries_.push_back(std::move(h));
    return *entries_.back();
  }

  /// The handle for the current device, or nullptr before its first product.
  DeviceHandle* find_current() {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    return find(device);
  }

 private:
  DeviceHandle* find(int device) {
    for (auto& e : entries_)
      if (e->device == device) return e.get();
    return nullptr;
  }

  std::vector<std::unique_ptr<DeviceHandle>> entries_;
};

HandleCache& cache() {
  thread_local HandleCache c;
  return c;
}

// ---- products ------------------------------------------------------------------------------

struct Product {
  Trans ta, tb;
  std::int64_t m, n, k;
  float alpha;
  const float* a;
  std::int64_t lda, stride_a;
  const float* b;
  std::int64_t ldb, stride_b;
  float beta;
  float* c;
  std::int64_t ldc, stride_c, batch;
};

/// Elements an operand spans in memory: `rows` x `cols` row-major with leading dimension
/// `ld`, `batch` of them `stride` apart (the gaps between rows and matrices included).
std::int64_t span_of(std::int64_t rows, std::int64_t cols, std::int64_t ld, std::int64_t batch,
                     std::int64_t stride) {
  return (batch - 1) * stride + (rows - 1) * ld + cols;
}

void run_matmul(DeviceHandle& h, cudaStream_t stream, DType math, const Product& p,
                const char* call) {
  const bool batched = p.batch > 1;
  h.bind(stream);
  const void* a = p.a;
  const void* b = p.b;
  const std::int64_t eb = operand_bytes(math);
  if (math != DType::f32) {
    // Narrow both operands (their whole spans, row and batch gaps included: the layouts keep
    // the same leading dimensions and strides) into the operand space, A first, B at the
    // next 256-byte boundary.
    const std::int64_t span_a = span_of(p.ta == Trans::no ? p.m : p.k,
                                        p.ta == Trans::no ? p.k : p.m, p.lda, p.batch, p.stride_a);
    const std::int64_t span_b = span_of(p.tb == Trans::no ? p.k : p.n,
                                        p.tb == Trans::no ? p.n : p.k, p.ldb, p.batch, p.stride_b);
    const std::int64_t b_offset = (span_a * eb + 255) / 256 * 256;
    auto* space = static_cast<unsigned char*>(
        h.operand_space(static_cast<std::size_t>(b_offset + span_b * eb), stream));
    auto* a16 = reinterpret_cast<std::uint16_t*>(space);
    auto* b16 = reinterpret_cast<std::uint16_t*>(space + b_offset);
    narrow_to_16bit(stream, p.a, a16, span_a, math == DType::f16);
    narrow_to_16bit(stream, p.b, b16, span_b, math == DType::f16);
    a = a16;
    b = b16;
  }
  const PlanKey key{p.ta,
                    p.tb,
                    p.m,
                    p.n,
                    p.k,
                    p.lda,
                    p.ldb,
                    p.ldc,
                    batched ? p.stride_a : 0,
                    batched ? p.stride_b : 0,
                    batched ? p.stride_c : 0,
                    p.batch,
                    math,
                    p.beta == 0.0F,
                    alignment_of(a, p.stride_a, p.batch, eb),
                    alignment_of(b, p.stride_b, p.batch, eb),
                    alignment_of(p.c, p.stride_c, p.batch)};
  const Plan& plan = h.plan(key, call);
  plan.run(h.handle, stream, h.workspace, p.alpha, a, b, p.beta, p.c);
}

// K == 0 or alpha == 0: no product, C = beta C without reading A or B, as BLAS specifies
// and the host back end does (OpenBLAS skips the product for both): beta == 0 writes
// zeros without reading C, beta == 1 leaves C alone. Any other beta is a product with
// zero operands of inner length 1 from the handle's zeros, in chunks of kZeroCount.
void scale_c(DeviceHandle& h, cudaStream_t stream, const Product& p, const char* call) {
  if (p.beta == 1.0F) return;
  for (std::int64_t i = 0; i < p.batch; ++i) {
    float* c = p.c + i * p.stride_c;
    if (p.beta == 0.0F) {
      DST_CUDA_CHECK(cudaMemset2DAsync(c, static_cast<std::size_t>(p.ldc) * sizeof(float), 0,
                                       static_cast<std::size_t>(p.n) * sizeof(float),
                                       static_cast<std::size_t>(p.m), stream));
      continue;
    }
    for (std::int64_t r0 = 0; r0 < p.m; r0 += kZeroCount) {
      for (std::int64_t c0 = 0; c0 < p.n; c0 += kZeroCount) {
        const std::int64_t rows = std::min(kZeroCount, p.m - r0);
        const std::int64_t cols = std::min(kZeroCount, p.n - c0);
        // (rows, cols) = zeros (rows, 1) x zeros (1, cols) + beta C
        const Product chunk{Trans::no, Trans::no, rows,    cols, 1, 1.0F,   h.zeros,
                            1,         0,         h.zeros, cols, 0, p.beta, c + r0 * p.ldc + c0,
                            p.ldc,     0,         1};
        run_matmul(h, stream, DType::f32, chunk, call);
      }
    }
  }
}

void product(void* stream_ptr, DType math, const Product& p, const char* call) {
  (void)compute_type(call, math);  // reject an unknown math mode before touching the device
  check_int32(call, "m", p.m);
  check_int32(call, "n", p.n);
  check_int32(call, "k", p.k);
  check_int32(call, "batch", p.batch);
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  DeviceHandle& h = cache().current();
  if (p.k == 0 || p.alpha == 0.0F) {
    scale_c(h, stream, p, call);
    return;
  }
  run_matmul(h, stream, math, p, call);
}

}  // namespace

void cublaslt_gemm(void* stream, DType math, Trans ta, Trans tb, std::int64_t m, std::int64_t n,
                   std::int64_t k, float alpha, const float* a, std::int64_t lda, const float* b,
                   std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  product(stream, math, Product{ta, tb, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0, 1},
          "blas::gemm (cuBLASLt)");
}

void cublaslt_gemm_strided_batched(void* stream, DType math, Trans ta, Trans tb, std::int64_t m,
                                   std::int64_t n, std::int64_t k, float alpha, const float* a,
                                   std::int64_t lda, std::int64_t stride_a, const float* b,
                                   std::int64_t ldb, std::int64_t stride_b, float beta, float* c,
                                   std::int64_t ldc, std::int64_t stride_c, std::int64_t batch) {
  product(stream, math,
          Product{ta, tb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc,
                  stride_c, batch},
          "blas::gemm_strided_batched (cuBLASLt)");
}

std::size_t cublaslt_cache_size() {
  const DeviceHandle* h = cache().find_current();
  return h != nullptr ? h->plans.size() : 0;
}

std::uint64_t cublaslt_heuristic_queries() {
  const DeviceHandle* h = cache().find_current();
  return h != nullptr ? h->heuristic_queries : 0;
}

}  // namespace dst::blas::detail
