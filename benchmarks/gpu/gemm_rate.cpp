// gpu_gemm_rate: the matrix-product rate this GPU reaches through cuBLASLt, for the MFU
// peak of GPU runs (benchmarks/gpu/throughput reads it). One product C (N, N) = A (N, N) x
// B (N, N)^T, the dense layer's y = x W^T (gemm.hpp, row-major; cuBLASLt's "TN" column-major
// form), timed in three modes, each printed as one JSON object per line on stdout:
//
//   bf16           A, B stored as bf16 (CUDA_R_16BF), C fp32, CUBLAS_COMPUTE_32F (fp32
//                  accumulation): the real bf16 tensor-core rate, the peak MFU is quoted
//                  against. Called here directly: dst::blas stores fp32 only.
//   f32_math_bf16  A, B, C fp32 through dst::blas::gemm with ExecContext::math = bf16: what
//                  the model's products get (A and B narrowed to bf16, then the bf16
//                  product, with its plan cache); the gap to "bf16" is the narrowing pass.
//   f32            A, B, C fp32, true fp32 products (CUBLAS_COMPUTE_32F) through
//                  dst::blas::gemm.
//
// Every mode multiplies the same values (uniform in [-1, 1], rounded to bf16, so exact in
// each mode's input type), with beta = 0, after `warmup` untimed products. Each of the
// `reps` timed products is bracketed by its own pair of CUDA events on one stream; the
// median is reported (and the minimum), with tflops = 2 N^3 / median. A few elements of C
// are checked against a double-precision dot product on the host afterwards, so a broken
// product cannot report a rate.
//
// Usage: gpu_gemm_rate [--size N] [--reps R] [--warmup W] [--modes bf16,f32_math_bf16,f32]
// Exit status: 0 measured, 1 error, 2 bad usage, 77 no CUDA device (CTest: skipped).
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "blas/detail/cublaslt_gemm.hpp"
#include "blas/gemm.hpp"
#include "core/bf16.hpp"
#include "core/error.hpp"

namespace {

using Index = std::int64_t;

constexpr int kExitError = 1;
constexpr int kExitUsage = 2;
constexpr int kExitNoDevice = 77;  // CTest's SKIP_RETURN_CODE for the smoke test

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw dst::Error(std::string(what) + ": " + cudaGetErrorName(status) + " (" +
                     cudaGetErrorString(status) + ")");
}

void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw dst::Error(std::string(what) + ": " + cublasLtGetStatusName(status) + " (" +
                     cublasLtGetStatusString(status) + ")");
}

struct Options {
  Index size = 8192;
  int reps = 20;
  int warmup = 3;
  std::vector<std::string> modes{"bf16", "f32_math_bf16", "f32"};
};

[[noreturn]] void usage(const std::string& problem) {
  std::cerr << "gpu_gemm_rate: " << problem << "\n"
            << "usage: gpu_gemm_rate [--size N] [--reps R] [--warmup W] "
               "[--modes bf16,f32_math_bf16,f32]\n";
  std::exit(kExitUsage);
}

long long parse_int(const std::string& flag, const char* text, long long lo, long long hi) {
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || v < lo || v > hi)
    usage(flag + " wants an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
          "], got '" + text + "'");
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage("missing value after " + flag);
    const char* value = argv[++i];
    if (flag == "--size") {
      // 2^16: the three fp32 matrices then take 48 GiB, about what a GPU holds.
      o.size = parse_int(flag, value, 1, 65536);
    } else if (flag == "--reps") {
      o.reps = static_cast<int>(parse_int(flag, value, 1, 100000));
    } else if (flag == "--warmup") {
      o.warmup = static_cast<int>(parse_int(flag, value, 0, 100000));
    } else if (flag == "--modes") {
      o.modes.clear();
      std::stringstream ss(value);
      std::string m;
      while (std::getline(ss, m, ','))
        if (m == "bf16" || m == "f32_math_bf16" || m == "f32")
          o.modes.push_back(m);
        else
          usage("unknown mode '" + m + "' (bf16, f32_math_bf16, f32)");
      if (o.modes.empty()) usage("--modes names no mode");
    } else {
      usage("unknown option " + flag);
    }
  }
  return o;
}

template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(std::size_t n) {
    void* p = nullptr;
    check_cuda(cudaMalloc(&p, n * sizeof(T)), "cudaMalloc");
    p_ = static_cast<T*>(p);
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { cudaFree(p_); }
  T* get() const { return p_; }

 private:
  T* p_ = nullptr;
};

/// Deterministic values in [-1, 1], rounded to bf16: every mode gets the same, exactly.
std::vector<float> make_values(std::size_t n, std::uint64_t seed) {
  std::vector<float> v(n);
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
  for (float& f : v) {
    x ^= x << 13;  // xorshift64
    x ^= x >> 7;
    x ^= x << 17;
    const auto u = static_cast<float>(x >> 40) * 0x1p-24F;  // [0, 1)
    f = dst::round_to_bf16(2.0F * u - 1.0F);
  }
  return v;
}

/// C (N, N) = A (N, N) x B (N, N)^T with bf16 A and B through cuBLASLt: the plan the
/// library would make for it (no split-K, the library's workspace size), built here.
class Bf16Product {
 public:
  Bf16Product(Index n, void* workspace) : workspace_(workspace) {
    check_cublas(cublasLtCreate(&handle_), "cublasLtCreate");
    check_cublas(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                 "cublasLtMatmulDescCreate");
    // Column-major C^T (N x N) = B (stored N x N, transposed) x A^T: "TN".
    const std::int32_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
    check_cublas(
        cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof transa),
        "TRANSA");
    check_cublas(
        cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof transb),
        "TRANSB");
    const auto un = static_cast<std::uint64_t>(n);
    check_cublas(cublasLtMatrixLayoutCreate(&a_, CUDA_R_16BF, un, un, n), "layout A");
    check_cublas(cublasLtMatrixLayoutCreate(&b_, CUDA_R_16BF, un, un, n), "layout B");
    check_cublas(cublasLtMatrixLayoutCreate(&c_, CUDA_R_32F, un, un, n), "layout C");
    cublasLtMatmulPreference_t pref = nullptr;
    check_cublas(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const std::uint64_t ws = dst::blas::detail::kCublasLtWorkspaceBytes;
    const std::uint32_t no_split_k = CUBLASLT_REDUCTION_SCHEME_NONE;
    cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    if (status == CUBLAS_STATUS_SUCCESS)
      status = cublasLtMatmulPreferenceSetAttribute(
          pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &no_split_k, sizeof no_split_k);
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    if (status == CUBLAS_STATUS_SUCCESS)
      status = cublasLtMatmulAlgoGetHeuristic(handle_, desc_, a_, b_, c_, c_, pref, 1, &result,
                                              &returned);
    cublasLtMatmulPreferenceDestroy(pref);
    check_cublas(status, "cublasLtMatmulAlgoGetHeuristic (bf16)");
    if (returned < 1) throw dst::Error("cuBLASLt has no algorithm for the bf16 product");
    algo_ = result.algo;
  }
  Bf16Product(const Bf16Product&) = delete;
  Bf16Product& operator=(const Bf16Product&) = delete;
  ~Bf16Product() {
    cublasLtMatrixLayoutDestroy(c_);
    cublasLtMatrixLayoutDestroy(b_);
    cublasLtMatrixLayoutDestroy(a_);
    cublasLtMatmulDescDestroy(desc_);
    cublasLtDestroy(handle_);
  }

  /// Row-major c = a b^T: column-major A' = b, B' = a.
  void run(const void* a, const void* b, float* c, cudaStream_t stream) const {
    const float alpha = 1.0F, beta = 0.0F;
    check_cublas(cublasLtMatmul(handle_, desc_, &alpha, b, a_, a, b_, &beta, c, c_, c, c_, &algo_,
                                workspace_, dst::blas::detail::kCublasLtWorkspaceBytes, stream),
                 "cublasLtMatmul (bf16)");
  }

 private:
  cublasLtHandle_t handle_ = nullptr;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, c_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  void* workspace_ = nullptr;
};

struct Timing {
  double median_ms, min_ms;
};

/// Times `reps` calls of `product` on `stream` after `warmup` untimed ones.
template <class F>
Timing time_product(F&& product, cudaStream_t stream, int warmup, int reps) {
  for (int i = 0; i < warmup; ++i)
    product();
  std::vector<cudaEvent_t> events(2 * static_cast<std::size_t>(reps));
  for (auto& e : events)
    check_cuda(cudaEventCreate(&e), "cudaEventCreate");
  for (int i = 0; i < reps; ++i) {
    check_cuda(cudaEventRecord(events[2 * i], stream), "cudaEventRecord");
    product();
    check_cuda(cudaEventRecord(events[2 * i + 1], stream), "cudaEventRecord");
  }
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  std::vector<double> ms(static_cast<std::size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    float t = 0.0F;
    check_cuda(cudaEventElapsedTime(&t, events[2 * i], events[2 * i + 1]), "cudaEventElapsedTime");
    ms[static_cast<std::size_t>(i)] = t;
  }
  for (auto& e : events)
    cudaEventDestroy(e);
  std::sort(ms.begin(), ms.end());
  const std::size_t h = ms.size() / 2;
  const double median = ms.size() % 2 == 1 ? ms[h] : 0.5 * (ms[h - 1] + ms[h]);
  return {median, ms.front()};
}

/// Checks a few elements of c = a b^T (row-major, n x n) against double dot products.
/// Inputs are exact in every mode and products accumulate in fp32: within 4 (n + 3) u of
/// the magnitude sum (the bound blas_cuda_test derives), u = 2^-24.
void check_result(const std::vector<float>& a, const std::vector<float>& b, Index n, float* dc,
                  const std::string& mode) {
  const Index samples[][2] = {{0, 0}, {n - 1, n - 1}, {n / 2, n / 3}, {n / 3, n - 1}};
  for (const auto& s : samples) {
    const Index i = s[0], j = s[1];
    float got = 0.0F;
    check_cuda(cudaMemcpy(&got, dc + i * n + j, sizeof got, cudaMemcpyDeviceToHost),
               "cudaMemcpy (check)");
    double ref = 0.0, mag = 0.0;
    for (Index l = 0; l < n; ++l) {
      const double p = static_cast<double>(a[static_cast<std::size_t>(i * n + l)]) *
                       b[static_cast<std::size_t>(j * n + l)];
      ref += p;
      mag += std::fabs(p);
    }
    const double tol = 4.0 * static_cast<double>(n + 3) * std::ldexp(1.0, -24) * mag;
    if (!(std::fabs(got - ref) <= tol)) {
      std::ostringstream os;
      os << "mode " << mode << ": C(" << i << ", " << j << ") = " << got << ", expected " << ref
         << " within " << tol;
      throw dst::Error(os.str());
    }
  }
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (static_cast<unsigned char>(ch) >= 0x20) out += ch;
  }
  return out + "\"";
}

void print_json(const std::string& mode, const char* a_type, const char* compute, Index n,
                const Options& o, const Timing& t, const std::string& device) {
  const double flops =
      2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
  std::printf(
      "{\"mode\":%s,\"m\":%lld,\"n\":%lld,\"k\":%lld,\"a_type\":\"%s\",\"c_type\":\"f32\","
      "\"compute\":\"%s\",\"reps\":%d,\"warmup\":%d,\"median_ms\":%.6g,\"min_ms\":%.6g,"
      "\"tflops\":%.6g,\"device\":%s,\"cublaslt_version\":%zu}\n",
      json_string(mode).c_str(), static_cast<long long>(n), static_cast<long long>(n),
      static_cast<long long>(n), a_type, compute, o.reps, o.warmup, t.median_ms, t.min_ms,
      flops / (t.median_ms * 1e-3) / 1e12, json_string(device).c_str(), cublasLtGetVersion());
  std::fflush(stdout);
}

int run(const Options& o) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::cerr << "gpu_gemm_rate: no CUDA device: skipped\n";
    return kExitNoDevice;
  }
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  check_cuda(cudaSetDevice(0), "cudaSetDevice");
  const Index n = o.size;
  const auto elems = static_cast<std::size_t>(n) * static_cast<std::size_t>(n);

  // Row-major x (N, N) and w (N, N): y = x w^T.
  const std::vector<float> x = make_values(elems, 1), w = make_values(elems, 2);
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreate(&stream), "cudaStreamCreate");
  const DeviceArray<float> dx(elems), dw(elems), dy(elems);
  check_cuda(cudaMemcpy(dx.get(), x.data(), elems * sizeof(float), cudaMemcpyHostToDevice),
             "upload x");
  check_cuda(cudaMemcpy(dw.get(), w.data(), elems * sizeof(float), cudaMemcpyHostToDevice),
             "upload w");

  for (const std::string& mode : o.modes) {
    check_cuda(cudaMemset(dy.get(), 0xff, elems * sizeof(float)), "cudaMemset");  // NaNs
    Timing t{};
    if (mode == "bf16") {
      std::vector<std::uint16_t> bits(elems);
      const DeviceArray<std::uint16_t> hx(elems), hw(elems);
      for (std::size_t i = 0; i < elems; ++i)
        bits[i] = dst::bf16::from_float(x[i]).bits;
      check_cuda(cudaMemcpy(hx.get(), bits.data(), elems * 2, cudaMemcpyHostToDevice), "upload");
      for (std::size_t i = 0; i < elems; ++i)
        bits[i] = dst::bf16::from_float(w[i]).bits;
      check_cuda(cudaMemcpy(hw.get(), bits.data(), elems * 2, cudaMemcpyHostToDevice), "upload");
      const DeviceArray<unsigned char> workspace(dst::blas::detail::kCublasLtWorkspaceBytes);
      const Bf16Product product(n, workspace.get());
      t = time_product([&] { product.run(hx.get(), hw.get(), dy.get(), stream); }, stream, o.warmup,
                       o.reps);
      check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      check_result(x, w, n, dy.get(), mode);
      print_json(mode, "bf16", "CUBLAS_COMPUTE_32F", n, o, t, prop.name);
    } else {
      const bool fast = mode == "f32_math_bf16";
      const dst::tensor::ExecContext ctx{dst::tensor::Backend::cuda, stream,
                                         fast ? dst::DType::bf16 : dst::DType::f32};
      t = time_product(
          [&] {
            dst::blas::gemm(ctx, dst::blas::Trans::no, dst::blas::Trans::yes, n, n, n, 1.0F,
                            dx.get(), n, dw.get(), n, 0.0F, dy.get(), n);
          },
          stream, o.warmup, o.reps);
      check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      check_result(x, w, n, dy.get(), mode);
      print_json(mode, "f32",
                 fast ? "CUBLAS_COMPUTE_32F (A, B narrowed to bf16)" : "CUBLAS_COMPUTE_32F", n, o,
                 t, prop.name);
    }
  }
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  check_cuda(cudaStreamDestroy(stream), "cudaStreamDestroy");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::cerr << "gpu_gemm_rate: error: " << e.what() << "\n";
    return kExitError;
  }
}
