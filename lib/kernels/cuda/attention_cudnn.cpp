// Fused causal attention, forward and backward, through cuDNN 9's backend (graph) API: the
// operation graphs below are the patterns cuDNN's fused flash-attention engines match (the
// "composite" SDPA graphs that cudnn-frontend lowers sdpa() / sdpa_backward() to for cuDNN
// before 9.21; cuDNN 9.19 has no causal mask on its single SDPA operation and no engine for
// its single SDPA backward operation, so the composite spelling is the way in). Plans are
// built once per (thread, device, shape, math) and cached with their descriptors; a shape
// cuDNN refuses is cached as refused, with the reason.
//
// Layout: our (B, T, heads, D) row-major tensors are cuDNN's [B, heads, T, D] with strides
// [T*heads*D, D, heads*D, 1] (BSHD), passed as they are. Matrix products that need K^T or V^T
// get the same memory described as [B, KV, D, T] (the last two dims and strides swapped);
// transposes inside the graph are RESHAPE nodes that only change strides. Virtual tensors
// (never in memory) are described packed; their strides do not matter.
//
// Storage is f32 and cuDNN reads and writes 16 bits, so every call converts its inputs into
// the CUDA back end's per-stream scratch (scratch.hpp), runs the plan there, and converts the
// outputs back; the same scratch block holds cuDNN's workspace and the backward's fp32
// buffers (softmax_sum, dQ_accum). Nothing else is allocated.
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <array>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/detail/attention_cudnn.hpp"
#include "kernels/cuda/detail/cuda_check.hpp"
#include "kernels/cuda/detail/scratch.hpp"

namespace dst::kernels::cuda_backend {
namespace detail {
namespace {

using Index = std::int64_t;
using Dims = std::array<Index, 4>;

// --- errors --------------------------------------------------------------------------------

std::string shape_text(const FusedAttentionShape& s) {
  return "B=" + std::to_string(s.b) + " T=" + std::to_string(s.t) + " H=" + std::to_string(s.h) +
         " KV=" + std::to_string(s.kv) + " D=" + std::to_string(s.d) + (s.f16 ? " f16" : " bf16");
}

/// "<call> returned CUDNN_STATUS_... (cuDNN's account of the failure)": cuDNN 9 keeps the
/// reasons of the last failure on this thread (cudnnGetLastErrorString), one per line, innermost
/// first; they are joined with " | " and cut at 400 characters.
std::string status_text(const cudnnStatus_t status, const char* call) {
  std::string text = std::string(call) + " returned " + cudnnGetErrorString(status);
  char detail[1024] = {};
  cudnnGetLastErrorString(detail, sizeof detail);
  std::string reasons;
  for (const char* c = detail; *c != '\0' && reasons.size() < 400; ++c) {
    if (*c == '\n') {
      if (!reasons.empty() && c[1] != '\0' && c[1] != '\n') reasons += " | ";
    } else {
      reasons += *c;
    }
  }
  if (!reasons.empty()) text += " (" + reasons + ")";
  return text;
}

[[noreturn]] void throw_cudnn_error(const cudnnStatus_t status, const char* call,
                                    const std::string& where, const char* file, const int line) {
  throw Error(where + ": " + status_text(status, call) + " [" + file + ":" + std::to_string(line) +
              "]");
}

/// Checks a cuDNN call made while running a plan: failure is a dst::Error naming `where`
/// (the kernel and the shape), the call text, the status and file:line.
#define DST_CUDNN_CHECK(call, where)                                                             \
  do {                                                                                           \
    const cudnnStatus_t dst_cudnn_status_ = (call);                                              \
    if (dst_cudnn_status_ != CUDNN_STATUS_SUCCESS)                                               \
      ::dst::kernels::cuda_backend::detail::throw_cudnn_error(dst_cudnn_status_, #call, (where), \
                                                              __FILE__, __LINE__);               \
  } while (0)

/// A refusal while building a graph or a plan: it makes fused_attention_supported() false
/// (and is cached), never an exception that leaves this file.
struct Declined {
  std::string why;
};

// --- descriptors ---------------------------------------------------------------------------

/// Owns backend descriptors and destroys them in reverse order of creation. A plan keeps
/// the whole set it was built from: the execution plan refers to its engine config, which
/// refers to the operation graph, its operations and their tensors.
class DescriptorSet {
 public:
  DescriptorSet() = default;
  DescriptorSet(const DescriptorSet&) = delete;
  DescriptorSet& operator=(const DescriptorSet&) = delete;
  ~DescriptorSet() {
    for (auto it = all_.rbegin(); it != all_.rend(); ++it)
      cudnnBackendDestroyDescriptor(*it);
  }

  /// Throws Declined naming `what` if cuDNN cannot create it.
  cudnnBackendDescriptor_t create(const cudnnBackendDescriptorType_t type, const char* what) {
    cudnnBackendDescriptor_t d = nullptr;
    const cudnnStatus_t status = cudnnBackendCreateDescriptor(type, &d);
    if (status != CUDNN_STATUS_SUCCESS)
      throw Declined{
          status_text(status, (std::string("cudnnBackendCreateDescriptor(") + what + ")").c_str())};
    all_.push_back(d);
    return d;
  }

  /// Destroys the descriptor created last (a plan that did not finalize).
  void destroy_last() {
    cudnnBackendDestroyDescriptor(all_.back());
    all_.pop_back();
  }

 private:
  std::vector<cudnnBackendDescriptor_t> all_;
};

/// A finalized execution plan and everything it refers to.
struct Plan {
  DescriptorSet descriptors;
  cudnnBackendDescriptor_t plan = nullptr;
  Index workspace_bytes = 0;
};

// --- graph building ------------------------------------------------------------------------

/// Where a tensor lives: device memory bound through the variant pack, a host scalar passed
/// by value (also bound through the variant pack, by its host address), or nowhere (an
/// intermediate the fused kernel keeps in registers or shared memory).
enum class Binding { device, by_value, virtual_only };

Dims packed_strides(const Dims& d) {
  return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1};
}

/// Our (B, T, heads, D) row-major layout as cuDNN's [B, heads, T, D].
Dims bshd_strides(const Index t, const Index heads, const Index d) {
  return {t * heads * d, d, heads * d, 1};
}

Dims swap_last_two(Dims d) {
  std::swap(d[2], d[3]);
  return d;
}

/// Sets attributes and appends operations of one operation graph; every failure throws
/// Declined naming the call (the attribute) and cuDNN's status and message.
class GraphBuilder {
 public:
  GraphBuilder(Plan& plan, const cudnnHandle_t handle) : plan_(plan), handle_(handle) {}

  cudnnBackendDescriptor_t tensor(const Index uid, const cudnnDataType_t type, const Dims& dims,
                                  const Dims& strides, const Binding binding) {
    cudnnBackendDescriptor_t t = plan_.descriptors.create(CUDNN_BACKEND_TENSOR_DESCRIPTOR,
                                                          "CUDNN_BACKEND_TENSOR_DESCRIPTOR");
    // 16 bytes: what cudnn-frontend declares for every tensor. Scratch pointers are 256-byte
    // aligned and kernels.cpp checks the stats tensor, the one caller pointer bound directly.
    const Index alignment = 16;
    const bool is_virtual = binding == Binding::virtual_only;
    const bool by_value = binding == Binding::by_value;
    set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "CUDNN_ATTR_TENSOR_UNIQUE_ID");
    set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type,
        "CUDNN_ATTR_TENSOR_DATA_TYPE");
    set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data(),
        "CUDNN_ATTR_TENSOR_DIMENSIONS");
    set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data(),
        "CUDNN_ATTR_TENSOR_STRIDES");
    set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment,
        "CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT");
    set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual,
        "CUDNN_ATTR_TENSOR_IS_VIRTUAL");
    set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value,
        "CUDNN_ATTR_TENSOR_IS_BY_VALUE");
    finalize(t, "CUDNN_BACKEND_TENSOR_DESCRIPTOR");
    return t;
  }

  cudnnBackendDescriptor_t intermediate(const Index uid, const cudnnDataType_t type,
                                        const Dims& dims) {
    return tensor(uid, type, dims, packed_strides(dims), Binding::virtual_only);
  }

  /// A float scalar passed by value (its host address goes into the variant pack).
  cudnnBackendDescriptor_t scalar(const Index uid) {
    return tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, Binding::by_value);
  }

  /// y = mode(x [, b [, t]]); `axis` only for GEN_INDEX. alpha1 = alpha2 = 1, as
  /// cudnn-frontend sets them.
  void pointwise(const cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x,
                 cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y,
                 const cudnnDataType_t math = CUDNN_DATA_FLOAT, const Index axis = -1) {
    cudnnBackendDescriptor_t pw = plan_.descriptors.create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR,
                                                           "CUDNN_BACKEND_POINTWISE_DESCRIPTOR");
    set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode,
        "CUDNN_ATTR_POINTWISE_MODE");
    set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math,
        "CUDNN_ATTR_POINTWISE_MATH_PREC");
    if (axis >= 0)
      set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "CUDNN_ATTR_POINTWISE_AXIS");
    finalize(pw, "CUDNN_BACKEND_POINTWISE_DESCRIPTOR");

    cudnnBackendDescriptor_t op =
        plan_.descriptors.create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR,
                                 "CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR");
    const float one = 1.0f;
    link(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw,
         "CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR");
    link(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, "CUDNN_ATTR_OPERATION_POINTWISE_XDESC");
    if (b != nullptr)
      link(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b, "CUDNN_ATTR_OPERATION_POINTWISE_BDESC");
    if (t != nullptr)
      link(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t, "CUDNN_ATTR_OPERATION_POINTWISE_TDESC");
    link(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, "CUDNN_ATTR_OPERATION_POINTWISE_YDESC");
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one,
        "CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1");
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one,
        "CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2");
    add_operation(op, "CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR");
  }

  /// c = a b over the last two dims, batched over the first two (a's heads may be a multiple
  /// of b's: grouped-query attention), fp32 accumulation.
  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    cudnnBackendDescriptor_t mm = plan_.descriptors.create(CUDNN_BACKEND_MATMUL_DESCRIPTOR,
                                                           "CUDNN_BACKEND_MATMUL_DESCRIPTOR");
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute,
        "CUDNN_ATTR_MATMUL_COMP_TYPE");
    finalize(mm, "CUDNN_BACKEND_MATMUL_DESCRIPTOR");
    cudnnBackendDescriptor_t op = plan_.descriptors.create(
        CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR");
    link(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a, "CUDNN_ATTR_OPERATION_MATMUL_ADESC");
    link(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b, "CUDNN_ATTR_OPERATION_MATMUL_BDESC");
    link(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c, "CUDNN_ATTR_OPERATION_MATMUL_CDESC");
    link(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm, "CUDNN_ATTR_OPERATION_MATMUL_DESC");
    add_operation(op, "CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR");
  }

  /// y = op over the dims where y has extent 1 (or fewer heads: the grouped-query sum).
  void reduction(const cudnnReduceTensorOp_t reduce, cudnnBackendDescriptor_t x,
                 cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t rd = plan_.descriptors.create(CUDNN_BACKEND_REDUCTION_DESCRIPTOR,
                                                           "CUDNN_BACKEND_REDUCTION_DESCRIPTOR");
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    set(rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &reduce,
        "CUDNN_ATTR_REDUCTION_OPERATOR");
    set(rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute,
        "CUDNN_ATTR_REDUCTION_COMP_TYPE");
    finalize(rd, "CUDNN_BACKEND_REDUCTION_DESCRIPTOR");
    cudnnBackendDescriptor_t op =
        plan_.descriptors.create(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR,
                                 "CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR");
    link(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x, "CUDNN_ATTR_OPERATION_REDUCTION_XDESC");
    link(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y, "CUDNN_ATTR_OPERATION_REDUCTION_YDESC");
    link(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd, "CUDNN_ATTR_OPERATION_REDUCTION_DESC");
    add_operation(op, "CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR");
  }

  /// y = x described with other dims/strides (a transpose, for the fused engines).
  void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t op = plan_.descriptors.create(
        CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR");
    link(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x, "CUDNN_ATTR_OPERATION_RESHAPE_XDESC");
    link(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y, "CUDNN_ATTR_OPERATION_RESHAPE_YDESC");
    add_operation(op, "CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR");
  }

  /// The operation graph, cuDNN's heuristics (mode A, then the fallback list), and the first
  /// engine configuration whose execution plan finalizes; its workspace size. Throws Declined
  /// with every refusal seen when none does.
  void build_plan() {
    cudnnBackendDescriptor_t graph = plan_.descriptors.create(
        CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR");
    set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
        static_cast<Index>(ops_.size()), ops_.data(), "CUDNN_ATTR_OPERATIONGRAPH_OPS");
    set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_,
        "CUDNN_ATTR_OPERATIONGRAPH_HANDLE");
    finalize(graph, "CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR (the graph)");

    std::string refusals;
    for (const cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
      const char* mode_name = mode == CUDNN_HEUR_MODE_A ? "heuristics mode A" : "fallback list";
      try {
        if (try_engines(graph, mode, mode_name, &refusals)) return;
      } catch (const Declined& d) {
        refusals += std::string(refusals.empty() ? "" : "; ") + mode_name + ": " + d.why;
      }
    }
    throw Declined{"no engine runs this graph (" + refusals + ")"};
  }

 private:
  void set(cudnnBackendDescriptor_t d, const cudnnBackendAttributeName_t name,
           const cudnnBackendAttributeType_t type, const Index count, const void* values,
           const char* what) {
    const cudnnStatus_t status = cudnnBackendSetAttribute(d, name, type, count, values);
    if (status != CUDNN_STATUS_SUCCESS)
      throw Declined{
          status_text(status, (std::string("cudnnBackendSetAttribute(") + what + ")").c_str())};
  }

  void link(cudnnBackendDescriptor_t d, const cudnnBackendAttributeName_t name,
            cudnnBackendDescriptor_t value, const char* what) {
    set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value, what);
  }

  void finalize(cudnnBackendDescriptor_t d, const char* what) {
    const cudnnStatus_t status = cudnnBackendFinalize(d);
    if (status != CUDNN_STATUS_SUCCESS)
      throw Declined{
          status_text(status, (std::string("cudnnBackendFinalize(") + what + ")").c_str())};
  }

  void add_operation(cudnnBackendDescriptor_t op, const char* what) {
    finalize(op, what);
    ops_.push_back(op);
  }

  /// True when one of the engine configurations of `mode` gave a plan (stored in plan_);
  /// appends each refusal to *refusals otherwise.
  bool try_engines(cudnnBackendDescriptor_t graph, const cudnnBackendHeurMode_t mode,
                   const char* mode_name, std::string* refusals) {
    cudnnBackendDescriptor_t heur = plan_.descriptors.create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR,
                                                             "CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR");
    link(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph,
         "CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH");
    set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode,
        "CUDNN_ATTR_ENGINEHEUR_MODE");
    finalize(heur, "CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR");
    Index count = 0;
    get(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, 0, &count, nullptr,
        "CUDNN_ATTR_ENGINEHEUR_RESULTS (count)");
    if (count == 0) {
      *refusals += std::string(refusals->empty() ? "" : "; ") + mode_name + ": no configuration";
      return false;
    }
    std::vector<cudnnBackendDescriptor_t> configs(static_cast<std::size_t>(count));
    for (auto& c : configs)
      c = plan_.descriptors.create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR,
                                   "CUDNN_BACKEND_ENGINECFG_DESCRIPTOR");
    Index returned = 0;
    get(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, count, &returned, configs.data(),
        "CUDNN_ATTR_ENGINEHEUR_RESULTS");
    for (Index i = 0; i < returned; ++i) {
      cudnnBackendDescriptor_t plan = plan_.descriptors.create(
          CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR");
      cudnnBackendDescriptor_t config = configs[static_cast<std::size_t>(i)];
      set(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_,
          "CUDNN_ATTR_EXECUTION_PLAN_HANDLE");
      link(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config,
           "CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG");
      const cudnnStatus_t status = cudnnBackendFinalize(plan);
      if (status == CUDNN_STATUS_SUCCESS) {
        Index bytes = 0;
        Index got = 0;
        const cudnnStatus_t ws = cudnnBackendGetAttribute(
            plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &got, &bytes);
        if (ws != CUDNN_STATUS_SUCCESS)
          throw Declined{status_text(
              ws, "cudnnBackendGetAttribute(CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)")};
        plan_.plan = plan;
        plan_.workspace_bytes = bytes;
        return true;
      }
      // The first refusal says why; the others are usually the same reason again.
      if (i == 0)
        *refusals += std::string(refusals->empty() ? "" : "; ") + mode_name + ": " +
                     std::to_string(returned) + " configuration(s), none finalized; the first: " +
                     status_text(status, "cudnnBackendFinalize(CUDNN_BACKEND_EXECUTION_PLAN)");
      plan_.descriptors.destroy_last();
    }
    return false;
  }

  void get(cudnnBackendDescriptor_t d, const cudnnBackendAttributeName_t name,
           const Index requested, Index* count, cudnnBackendDescriptor_t* values,
           const char* what) {
    const cudnnStatus_t status =
        cudnnBackendGetAttribute(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, requested, count, values);
    if (status != CUDNN_STATUS_SUCCESS)
      throw Declined{
          status_text(status, (std::string("cudnnBackendGetAttribute(") + what + ")").c_str())};
  }

  Plan& plan_;
  cudnnHandle_t handle_;
  std::vector<cudnnBackendDescriptor_t> ops_;
};

// --- the two graphs ------------------------------------------------------------------------

/// Unique ids of the tensors bound through the variant pack (1..14) and of the intermediates
/// (100s forward, 200s backward), named as in cudnn-frontend's composite SDPA nodes.
enum Uid : Index {
  kQ = 1,
  kK = 2,  // described as K^T [B, KV, D, T]
  kV = 3,  // [B, KV, T, D] forward; V^T [B, KV, D, T] backward
  kO = 4,
  kStats = 5,      // [B, H, T, 1] fp32, packed: log-sum-exp of the scaled, masked scores
  kScale = 6,      // by value
  kMaskValue = 7,  // by value: what masked scores become
  kDO = 8,
  kDQ = 9,
  kDK = 10,
  kDV = 11,
  kOne = 12,         // by value, 1.0: the dropout-scale slot of softmax_sum
  kSoftmaxSum = 13,  // [B, H, T, 1] fp32 scratch: rowsum(dO * O)
  kDQAccum = 14,     // [B, H, T, D] fp32 scratch: dQ accumulated before the 16-bit output

  kFwdScores = 101,   // S = Q K^T
  kFwdScaled = 102,   // S * scale
  kFwdRow = 103,      // query index (int32)
  kFwdCol = 104,      // key index (int32)
  kFwdCausal = 105,   // row >= col (boolean)
  kFwdMasked = 106,   // select(causal, S * scale, mask value)
  kFwdMax = 107,      // row max M
  kFwdCentred = 108,  // masked - M
  kFwdExp = 109,      // exp(masked - M)
  kFwdSum = 110,      // row sum Z
  kFwdLogSum = 111,   // log Z
  kFwdProbs = 112,    // P = exp / Z, 16-bit (bmm2's A operand is the I/O type)

  kBwdDOxO = 201,       // dO * O
  kBwdRowSum = 202,     // rowsum(dO * O)
  kBwdScores = 203,     // S = Q K^T
  kBwdScaled = 204,     // S * scale
  kBwdCentred = 205,    // S * scale - stats
  kBwdRow = 206,        // query index
  kBwdCol = 207,        // key index
  kBwdCausal = 208,     // row >= col
  kBwdMasked = 209,     // select(causal, S * scale - stats, mask value)
  kBwdProbs = 210,      // P = exp(masked)
  kBwdProbsT = 211,     // P^T, 16-bit
  kBwdDVFull = 212,     // P^T dO per query head, 16-bit (grouped-query only)
  kBwdDP = 213,         // dP = dO V^T
  kBwdDPCentred = 214,  // dP - softmax_sum
  kBwdDSRaw = 215,      // (dP - softmax_sum) * P
  kBwdDS = 216,         // dS = ... * scale
  kBwdDST = 217,        // dS^T, 16-bit
  kBwdDKFull = 218,     // dS^T Q per query head, 16-bit (grouped-query only)
  kBwdK = 219,          // K [B, KV, T, D]: K^T transposed back
};

cudnnDataType_t io_type(const FusedAttentionShape& s) {
  return s.f16 ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16;
}

/// masked = x where key index <= query index, else the mask value: GEN_INDEX along the
/// query (2) and key (3) axes into int32, CMP_GE in boolean, BINARY_SELECT (y = t ? x : b).
/// The top-left-aligned causal mask of cudnn-frontend (right bound 0, no left bound).
void causal_mask(GraphBuilder& g, const Dims& scores, cudnnBackendDescriptor_t x,
                 cudnnBackendDescriptor_t mask_value, cudnnBackendDescriptor_t masked,
                 const Index row_uid, const Index col_uid, const Index causal_uid) {
  auto row = g.intermediate(row_uid, CUDNN_DATA_INT32, scores);
  auto col = g.intermediate(col_uid, CUDNN_DATA_INT32, scores);
  auto causal = g.intermediate(causal_uid, CUDNN_DATA_BOOLEAN, scores);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, nullptr, row, CUDNN_DATA_FLOAT, 2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, nullptr, col, CUDNN_DATA_FLOAT, 3);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, row, col, nullptr, causal, CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, x, mask_value, causal, masked);
}

/// O = softmax(causal(scale Q K^T)) V and Stats = M + log Z per row.
void build_forward(GraphBuilder& g, const FusedAttentionShape& s) {
  const cudnnDataType_t io = io_type(s);
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  const Dims q_dims{s.b, s.h, s.t, s.d};
  const Dims scores{s.b, s.h, s.t, s.t};
  const Dims rows{s.b, s.h, s.t, 1};

  auto q = g.tensor(kQ, io, q_dims, bshd_strides(s.t, s.h, s.d), Binding::device);
  auto kt = g.tensor(kK, io, {s.b, s.kv, s.d, s.t}, swap_last_two(bshd_strides(s.t, s.kv, s.d)),
                     Binding::device);
  auto v = g.tensor(kV, io, {s.b, s.kv, s.t, s.d}, bshd_strides(s.t, s.kv, s.d), Binding::device);
  auto o = g.tensor(kO, io, q_dims, bshd_strides(s.t, s.h, s.d), Binding::device);
  auto stats = g.tensor(kStats, f32, rows, packed_strides(rows), Binding::device);
  auto scale = g.scalar(kScale);
  auto mask_value = g.scalar(kMaskValue);

  auto raw = g.intermediate(kFwdScores, f32, scores);
  g.matmul(q, kt, raw);
  auto scaled = g.intermediate(kFwdScaled, f32, scores);
  g.pointwise(CUDNN_POINTWISE_MUL, raw, scale, nullptr, scaled);
  auto masked = g.intermediate(kFwdMasked, f32, scores);
  causal_mask(g, scores, scaled, mask_value, masked, kFwdRow, kFwdCol, kFwdCausal);

  // Softmax with statistics, as cudnn-frontend's composite softmax spells it before 9.21.
  auto max = g.intermediate(kFwdMax, f32, rows);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, masked, max);
  auto centred = g.intermediate(kFwdCentred, f32, scores);
  g.pointwise(CUDNN_POINTWISE_SUB, masked, max, nullptr, centred);
  auto e = g.intermediate(kFwdExp, f32, scores);
  g.pointwise(CUDNN_POINTWISE_EXP, centred, nullptr, nullptr, e);
  auto sum = g.intermediate(kFwdSum, f32, rows);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, sum);
  auto log_sum = g.intermediate(kFwdLogSum, f32, rows);
  g.pointwise(CUDNN_POINTWISE_LOG, sum, nullptr, nullptr, log_sum);
  g.pointwise(CUDNN_POINTWISE_ADD, max, log_sum, nullptr, stats);
  auto p = g.intermediate(kFwdProbs, io, scores);
  g.pointwise(CUDNN_POINTWISE_DIV, e, sum, nullptr, p);

  g.matmul(p, v, o);
}

/// dQ, dK, dV of the forward above, given dO, O and Stats (cudnn-frontend's composite SDPA
/// backward for cuDNN >= 9: P recomputed from Stats, softmax_sum and dQ_accum in fp32 scratch,
/// grouped-query dK and dV summed over each group's query heads by reductions).
void build_backward(GraphBuilder& g, const FusedAttentionShape& s) {
  const cudnnDataType_t io = io_type(s);
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  const Dims q_dims{s.b, s.h, s.t, s.d};
  const Dims kv_dims{s.b, s.kv, s.t, s.d};
  const Dims kv_t_dims{s.b, s.kv, s.d, s.t};
  const Dims scores{s.b, s.h, s.t, s.t};
  const Dims scores_t_strides{s.h * s.t * s.t, s.t * s.t, 1, s.t};  // [b, h, kv pos, q pos]
  const Dims rows{s.b, s.h, s.t, 1};
  const Dims q_strides = bshd_strides(s.t, s.h, s.d);
  const Dims kv_strides = bshd_strides(s.t, s.kv, s.d);

  auto q = g.tensor(kQ, io, q_dims, q_strides, Binding::device);
  auto kt = g.tensor(kK, io, kv_t_dims, swap_last_two(kv_strides), Binding::device);
  auto vt = g.tensor(kV, io, kv_t_dims, swap_last_two(kv_strides), Binding::device);
  auto o = g.tensor(kO, io, q_dims, q_strides, Binding::device);
  auto d_o = g.tensor(kDO, io, q_dims, q_strides, Binding::device);
  auto stats = g.tensor(kStats, f32, rows, packed_strides(rows), Binding::device);
  auto dq = g.tensor(kDQ, io, q_dims, q_strides, Binding::device);
  auto dk = g.tensor(kDK, io, kv_dims, kv_strides, Binding::device);
  auto dv = g.tensor(kDV, io, kv_dims, kv_strides, Binding::device);
  auto scale = g.scalar(kScale);
  auto mask_value = g.scalar(kMaskValue);
  auto one = g.scalar(kOne);
  // Packed, as the engines' spill buffers assume.
  auto softmax_sum = g.tensor(kSoftmaxSum, f32, rows, packed_strides(rows), Binding::device);
  auto dq_accum = g.tensor(kDQAccum, f32, q_dims, packed_strides(q_dims), Binding::device);

  // softmax_sum = rowsum(dO * O) * 1
  auto do_o = g.intermediate(kBwdDOxO, f32, q_dims);
  g.pointwise(CUDNN_POINTWISE_MUL, d_o, o, nullptr, do_o);
  auto row_sum = g.intermediate(kBwdRowSum, f32, rows);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, do_o, row_sum);
  g.pointwise(CUDNN_POINTWISE_MUL, row_sum, one, nullptr, softmax_sum);

  // P = exp(causal(scale Q K^T - Stats))
  auto raw = g.intermediate(kBwdScores, f32, scores);
  g.matmul(q, kt, raw);
  auto scaled = g.intermediate(kBwdScaled, f32, scores);
  g.pointwise(CUDNN_POINTWISE_MUL, raw, scale, nullptr, scaled);
  auto centred = g.intermediate(kBwdCentred, f32, scores);
  g.pointwise(CUDNN_POINTWISE_SUB, scaled, stats, nullptr, centred);
  auto masked = g.intermediate(kBwdMasked, f32, scores);
  causal_mask(g, scores, centred, mask_value, masked, kBwdRow, kBwdCol, kBwdCausal);
  auto p = g.intermediate(kBwdProbs, f32, scores);
  g.pointwise(CUDNN_POINTWISE_EXP, masked, nullptr, nullptr, p);

  const bool grouped = s.h != s.kv;
  // dV = P^T dO (summed over each group's query heads)
  auto pt = g.tensor(kBwdProbsT, io, scores, scores_t_strides, Binding::virtual_only);
  g.reshape(p, pt);
  if (grouped) {
    auto dv_full = g.intermediate(kBwdDVFull, io, q_dims);
    g.matmul(pt, d_o, dv_full);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, dv_full, dv);
  } else {
    g.matmul(pt, d_o, dv);
  }

  // dS = scale * P * (dO V^T - softmax_sum)
  auto dp = g.intermediate(kBwdDP, f32, scores);
  g.matmul(d_o, vt, dp);
  auto dp_centred = g.intermediate(kBwdDPCentred, f32, scores);
  g.pointwise(CUDNN_POINTWISE_SUB, dp, softmax_sum, nullptr, dp_centred);
  auto ds_raw = g.intermediate(kBwdDSRaw, f32, scores);
  g.pointwise(CUDNN_POINTWISE_MUL, dp_centred, p, nullptr, ds_raw);
  auto ds = g.intermediate(kBwdDS, f32, scores);
  g.pointwise(CUDNN_POINTWISE_MUL, ds_raw, scale, nullptr, ds);

  // dK = dS^T Q (summed over each group's query heads)
  auto dst = g.tensor(kBwdDST, io, scores, scores_t_strides, Binding::virtual_only);
  g.reshape(ds, dst);
  if (grouped) {
    auto dk_full = g.intermediate(kBwdDKFull, io, q_dims);
    g.matmul(dst, q, dk_full);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, dk_full, dk);
  } else {
    g.matmul(dst, q, dk);
  }

  // dQ = dS K, accumulated in fp32, then written in the I/O type
  auto k = g.tensor(kBwdK, f32, kv_dims, kv_strides, Binding::virtual_only);
  g.reshape(kt, k);
  g.matmul(ds, k, dq_accum);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, dq_accum, nullptr, nullptr, dq);
}

// --- per-thread, per-device state ------------------------------------------------------------

struct PlanKey {
  Index b, t, h, kv, d;
  bool f16;
  bool operator<(const PlanKey& o) const {
    return std::tie(b, t, h, kv, d, f16) < std::tie(o.b, o.t, o.h, o.kv, o.d, o.f16);
  }
};

/// Both plans of one shape, or why there are none.
struct ShapePlans {
  std::unique_ptr<Plan> forward, backward;
  std::string why;  ///< empty when both plans exist
};

struct DeviceState {
  int device = 0;
  cudnnHandle_t handle = nullptr;
  std::string refusal;    ///< why nothing runs on this device (no handle, old cuDNN, old GPU)
  int compute_major = 0;  ///< the device's compute capability (major), once known
  std::map<PlanKey, ShapePlans> plans;
};

/// Why this device and cuDNN library cannot run the graphs, or "".
std::string environment_refusal(const int device, int* compute_major) {
  const std::size_t version = cudnnGetVersion();
  // The graphs above are cuDNN 9's spelling (cudnn-frontend gates older releases with other
  // graphs and sequence-length limits).
  if (version < 90000)
    return "cuDNN " + std::to_string(version) + " at run time; these graphs need cuDNN 9";
  // cudnn-frontend's support surface refuses these two releases for fp16/bf16 SDPA
  // ("known bugs"; node/sdpa_support_surface.h).
  if (version == 91000 || version == 91001)
    return "cuDNN " + std::to_string(version) + " has known fp16/bf16 SDPA bugs (use 9.10.2+)";
  int major = 0;
  const cudaError_t status =
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (status != cudaSuccess)
    return std::string("cudaDeviceGetAttribute(compute capability) failed: ") +
           cudaGetErrorString(status);
  *compute_major = major;
  if (major < 8)
    return "compute capability " + std::to_string(major) +
           ".x: cuDNN's fused attention needs sm_80 or newer";
  return "";
}

/// Never destroyed (like the scratch blocks, scratch.hpp): destroying handles and plans at
/// thread exit could run after the CUDA runtime has shut down. One handle per thread and
/// device, so no locks: a plan is used only with the handle it was built with.
std::vector<std::unique_ptr<DeviceState>>& thread_states() {
  thread_local auto* states = new std::vector<std::unique_ptr<DeviceState>>();
  return *states;
}

/// The current device's state, created (handle, environment check) on first use; null with
/// *why set when even the current device cannot be told.
DeviceState* device_state(std::string* why) {
  int device = 0;
  const cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();  // reset the runtime's last error: later calls are not to blame
    *why = std::string("cudaGetDevice failed: ") + cudaGetErrorName(status) + " (" +
           cudaGetErrorString(status) + ")";
    return nullptr;
  }
  auto& states = thread_states();
  for (auto& s : states)
    if (s->device == device) return s.get();
  auto state = std::make_unique<DeviceState>();
  state->device = device;
  state->refusal = environment_refusal(device, &state->compute_major);
  if (state->refusal.empty()) {
    const cudnnStatus_t created = cudnnCreate(&state->handle);
    if (created != CUDNN_STATUS_SUCCESS) {
      state->handle = nullptr;
      state->refusal = status_text(created, "cudnnCreate");
    }
  }
  states.push_back(std::move(state));
  return states.back().get();
}

/// Limits cuDNN 9 documents for fp16/bf16 SDPA (cudnn-frontend's support surface,
/// node/sdpa_support_surface.h and the backward node's checks), checked before any graph is
/// built so the reason is plain. Forward and backward are refused together (the model runs
/// both or neither fused).
std::string shape_refusal(const FusedAttentionShape& s, const int compute_major) {
  if (s.b < 1 || s.t < 1 || s.h < 1 || s.kv < 1 || s.d < 1) return "every extent must be >= 1";
  if (s.h % s.kv != 0) return "H is not a multiple of KV";
  if (s.d % 8 != 0 || s.d > 256) return "head dim D must be a multiple of 8 and at most 256";
  // The backward supports D up to 256 on Hopper and Blackwell only (sm_90, sm_100).
  if (s.d > 128 && compute_major != 9 && compute_major != 10)
    return "head dim D > 128: cuDNN's SDPA backward needs sm_90 or sm_100 for it";
  if (s.t == 1) return "T = 1: cuDNN's SDPA backward does not support query and key length 1";
  // Up to 9.15.0 the backward needs a padding mask as a work-around of a cuDNN bug when
  // the key length is not a multiple of 128 (cudnn-frontend adds one); these graphs have
  // none, so such releases run those lengths unfused.
  const std::size_t version = cudnnGetVersion();
  if (version <= 91500 && s.t % 128 != 0)
    return "cuDNN " + std::to_string(version) +
           " (<= 9.15.0) needs a padding-mask work-around in the SDPA backward when T is not a "
           "multiple of 128 (" +
           std::to_string(s.t) + ")";
  return "";
}

std::unique_ptr<Plan> make_plan(const cudnnHandle_t handle, const FusedAttentionShape& s,
                                const bool forward) {
  auto plan = std::make_unique<Plan>();
  GraphBuilder g(*plan, handle);
  if (forward)
    build_forward(g, s);
  else
    build_backward(g, s);
  g.build_plan();
  return plan;
}

/// The cached plans of `s` on this device, built on first use.
const ShapePlans& shape_plans(DeviceState& state, const FusedAttentionShape& s) {
  const PlanKey key{s.b, s.t, s.h, s.kv, s.d, s.f16};
  auto found = state.plans.find(key);
  if (found != state.plans.end()) return found->second;
  ShapePlans entry;
  entry.why = shape_refusal(s, state.compute_major);
  if (entry.why.empty()) {
    try {
      entry.forward = make_plan(state.handle, s, true);
    } catch (const Declined& d) {
      entry.why = "forward graph: " + d.why;
    }
  }
  if (entry.why.empty()) {
    try {
      entry.backward = make_plan(state.handle, s, false);
    } catch (const Declined& d) {
      entry.why = "backward graph: " + d.why;
    }
  }
  if (!entry.why.empty()) {
    entry.forward.reset();
    entry.backward.reset();
  }
  return state.plans.emplace(key, std::move(entry)).first->second;
}

/// The device state and plans for running `s`; throws dst::Error naming `where` when cuDNN
/// cannot run it (kernels.cpp asks fused_attention_supported first, so this is a misuse).
struct Runnable {
  DeviceState* state;
  const ShapePlans* plans;
};

Runnable runnable(const FusedAttentionShape& s, const std::string& where) {
  std::string why;
  DeviceState* state = device_state(&why);
  if (state == nullptr) throw Error(where + ": " + why);
  if (!state->refusal.empty())
    throw Error(where + ": fused attention unavailable: " + state->refusal);
  const ShapePlans& plans = shape_plans(*state, s);
  if (!plans.why.empty()) throw Error(where + ": cuDNN declines this shape: " + plans.why);
  return {state, &plans};
}

/// Masked scores: -inf from cuDNN 9.10 on, the lowest finite float before (cudnn-frontend's
/// choice, attn_score_modifiers.h: older releases prefer it for the softmax mask).
float mask_value() {
  return cudnnGetVersion() >= 91000 ? -std::numeric_limits<float>::infinity()
                                    : std::numeric_limits<float>::lowest();
}

bool aligned16(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

/// Binds the variant pack and runs the plan on the handle's stream.
void execute(const cudnnHandle_t handle, const Plan& plan, const std::vector<Index>& uids,
             const std::vector<void*>& pointers, void* workspace, const std::string& where) {
  cudnnBackendDescriptor_t pack = nullptr;
  DST_CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack),
                  where);
  struct Destroy {
    cudnnBackendDescriptor_t d;
    ~Destroy() { cudnnBackendDestroyDescriptor(d); }
  } destroy{pack};
  const auto n = static_cast<Index>(uids.size());
  DST_CUDNN_CHECK(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
                                           CUDNN_TYPE_INT64, n, uids.data()),
                  where);
  DST_CUDNN_CHECK(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                           CUDNN_TYPE_VOID_PTR, n, pointers.data()),
                  where);
  DST_CUDNN_CHECK(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
                                           CUDNN_TYPE_VOID_PTR, 1, &workspace),
                  where);
  DST_CUDNN_CHECK(cudnnBackendFinalize(pack), where);
  DST_CUDNN_CHECK(cudnnBackendExecute(handle, plan.plan, pack), where);
}

template <class T>
T* at(const Scratch& s, const std::size_t offset) {
  return reinterpret_cast<T*>(s.device + offset);
}

/// What both passes do first: the message prefix, the stats alignment cuDNN needs, the
/// shape's plans (or the reason there are none), the handle bound to `stream`.
struct Launch {
  std::string where;
  Runnable ready;
  cudaStream_t stream;
};

Launch begin_launch(void* stream, const char* kernel, const FusedAttentionShape& s,
                    const float* stats) {
  Launch l{std::string("kernels::") + kernel + " (" + shape_text(s) + ")", {}, nullptr};
  if (!aligned16(stats))
    throw Error(l.where + ": stats must be 16-byte aligned (cuDNN reads and writes it directly)");
  l.ready = runnable(s, l.where);
  l.stream = static_cast<cudaStream_t>(stream);
  DST_CUDNN_CHECK(cudnnSetStream(l.ready.state->handle, l.stream), l.where);
  return l;
}

}  // namespace
}  // namespace detail

bool fused_attention_supported(const FusedAttentionShape& shape, std::string* why) {
  using namespace detail;
  std::string reason;
  DeviceState* state = device_state(&reason);
  if (state != nullptr) reason = state->refusal;
  if (reason.empty()) {
    reason = shape_plans(*state, shape).why;
    if (reason.empty()) return true;
  }
  if (why != nullptr) *why = reason;
  return false;
}

void fused_attention_forward(void* stream, const FusedAttentionForwardArgs& a) {
  using namespace detail;
  const FusedAttentionShape& s = a.shape;
  const Launch l = begin_launch(stream, "fused_attention_forward", s, a.stats);
  const std::string& where = l.where;
  const Runnable& ready = l.ready;
  const Plan& plan = *ready.plans->forward;
  const cudaStream_t cs = l.stream;

  const Index nq = s.b * s.t * s.h * s.d;
  const Index nkv = s.b * s.t * s.kv * s.d;
  constexpr std::size_t k16 = 2;  // bytes of a bf16 / f16 element
  ScratchLayout layout;
  const std::size_t q_at = layout.add(static_cast<std::size_t>(nq) * k16);
  const std::size_t k_at = layout.add(static_cast<std::size_t>(nkv) * k16);
  const std::size_t v_at = layout.add(static_cast<std::size_t>(nkv) * k16);
  const std::size_t o_at = layout.add(static_cast<std::size_t>(nq) * k16);
  const std::size_t ws_at = layout.add(static_cast<std::size_t>(plan.workspace_bytes));
  const Scratch scratch_block = scratch(cs, layout.bytes());
  auto* q16 = at<std::uint16_t>(scratch_block, q_at);
  auto* k16p = at<std::uint16_t>(scratch_block, k_at);
  auto* v16 = at<std::uint16_t>(scratch_block, v_at);
  auto* o16 = at<std::uint16_t>(scratch_block, o_at);

  to_16bit(cs, a.q, q16, nq, s.f16);
  to_16bit(cs, a.k, k16p, nkv, s.f16);
  to_16bit(cs, a.v, v16, nkv, s.f16);
  float scale = a.scale;
  float masked = mask_value();
  execute(ready.state->handle, plan, {kQ, kK, kV, kO, kStats, kScale, kMaskValue},
          {q16, k16p, v16, o16, a.stats, &scale, &masked}, at<char>(scratch_block, ws_at), where);
  from_16bit(cs, o16, a.out, nq, s.f16);
}

void fused_attention_backward(void* stream, const FusedAttentionBackwardArgs& a) {
  using namespace detail;
  const FusedAttentionShape& s = a.shape;
  const Launch l = begin_launch(stream, "fused_attention_backward", s, a.stats);
  const std::string& where = l.where;
  const Runnable& ready = l.ready;
  const Plan& plan = *ready.plans->backward;
  const cudaStream_t cs = l.stream;

  const Index nq = s.b * s.t * s.h * s.d;
  const Index nkv = s.b * s.t * s.kv * s.d;
  const Index nrows = s.b * s.h * s.t;
  constexpr std::size_t k16 = 2;
  const auto q_bytes = static_cast<std::size_t>(nq) * k16;
  const auto kv_bytes = static_cast<std::size_t>(nkv) * k16;
  ScratchLayout layout;
  const std::size_t q_at = layout.add(q_bytes);
  const std::size_t k_at = layout.add(kv_bytes);
  const std::size_t v_at = layout.add(kv_bytes);
  const std::size_t o_at = layout.add(q_bytes);
  const std::size_t do_at = layout.add(q_bytes);
  const std::size_t dq_at = layout.add(q_bytes);
  const std::size_t dk_at = layout.add(kv_bytes);
  const std::size_t dv_at = layout.add(kv_bytes);
  const std::size_t sum_at = layout.add(static_cast<std::size_t>(nrows) * sizeof(float));
  const std::size_t dq_accum_bytes = static_cast<std::size_t>(nq) * sizeof(float);
  const std::size_t dq_accum_at = layout.add(dq_accum_bytes);
  const std::size_t ws_at = layout.add(static_cast<std::size_t>(plan.workspace_bytes));
  const Scratch scratch_block = scratch(cs, layout.bytes());
  auto* q16 = at<std::uint16_t>(scratch_block, q_at);
  auto* k16p = at<std::uint16_t>(scratch_block, k_at);
  auto* v16 = at<std::uint16_t>(scratch_block, v_at);
  auto* o16 = at<std::uint16_t>(scratch_block, o_at);
  auto* do16 = at<std::uint16_t>(scratch_block, do_at);
  auto* dq16 = at<std::uint16_t>(scratch_block, dq_at);
  auto* dk16 = at<std::uint16_t>(scratch_block, dk_at);
  auto* dv16 = at<std::uint16_t>(scratch_block, dv_at);
  auto* dq_accum = at<float>(scratch_block, dq_accum_at);

  to_16bit(cs, a.q, q16, nq, s.f16);
  to_16bit(cs, a.k, k16p, nkv, s.f16);
  to_16bit(cs, a.v, v16, nkv, s.f16);
  to_16bit(cs, a.out, o16, nq, s.f16);  // exact: the forward wrote 16-bit values
  to_16bit(cs, a.dout, do16, nq, s.f16);
  // cuDNN clears dQ_accum itself from 9.6 on; before, the caller must (cudnn-frontend's
  // workspace modifications, node/scaled_dot_product_flash_attention.h).
  if (cudnnGetVersion() < 90600) DST_CUDA_CHECK(cudaMemsetAsync(dq_accum, 0, dq_accum_bytes, cs));
  float scale = a.scale;
  float masked = mask_value();
  float one = 1.0f;
  execute(
      ready.state->handle, plan,
      {kQ, kK, kV, kO, kStats, kScale, kMaskValue, kDO, kDQ, kDK, kDV, kOne, kSoftmaxSum, kDQAccum},
      {q16, k16p, v16, o16, const_cast<float*>(a.stats), &scale, &masked, do16, dq16, dk16, dv16,
       &one, at<float>(scratch_block, sum_at), dq_accum},
      at<char>(scratch_block, ws_at), where);
  from_16bit(cs, dq16, a.dq, nq, s.f16);
  from_16bit(cs, dk16, a.dk, nkv, s.f16);
  from_16bit(cs, dv16, a.dv, nkv, s.f16);
}

}  // namespace dst::kernels::cuda_backend
