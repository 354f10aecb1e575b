#pragma once
/// \file param_store.hpp
/// All parameters in one contiguous f32 buffer, all gradients in another of the same
/// layout; each tensor is a named view at an offset. Gradient all-reduce buckets, ZeRO
/// shards and checkpoint hyperslabs are ranges of these buffers.
///
/// Names and shapes are those of Hugging Face's LlamaForCausalLM state dict
/// ("model.layers.3.self_attn.q_proj.weight", (out, in) as nn.Linear stores them), so a
/// parameter file is readable by, and comparable with, the reference implementation.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "config/run_config.hpp"
#include "tensor/arena.hpp"
#include "tensor/context.hpp"
#include "tensor/tensor.hpp"

namespace dst::model {

/// How a parameter starts.
enum class Init : std::uint8_t {
  normal,  ///< N(0, std^2) from the counter-based generator
  ones,    ///< RMSNorm weights
  zeros,   ///< the MoE router's correction bias (moved by balancing, not by gradients)
};

/// How a parameter splits across the ranks of a tensor-parallel group (Megatron-LM's
/// scheme, Shoeybi et al. 2019). Each layer records it with its parameters; with
/// parallel.tensor = T > 1 each rank's layers declare their slice (ParamSpec::tp_size).
enum class Split : std::uint8_t {
  replicated,  ///< every rank holds all of it (norm weights)
  column,      ///< (out, in) split by output rows: each rank computes a slice of the outputs
  row,         ///< split by input columns: each rank reads a slice, the outputs are summed
  vocab,       ///< split by vocabulary rows (the embedding and the lm head)
};

/// "replicated", "column", "row" or "vocab".
std::string_view split_name(Split s);

struct ParamSpec {
  std::string name;
  tensor::Shape shape;
  Init init = Init::normal;
  float std = 0.0f;          ///< for Init::normal
  bool weight_decay = true;  ///< false for norms (AdamW skips them)
  std::size_t offset = 0;    ///< elements from the start of the flat buffer (64-byte aligned)
  Split split = Split::replicated;  ///< how tensor parallelism splits it
  /// Tensor parallelism: `shape` is slice tp_rank of tp_size equal slices of the logical
  /// tensor along the split's dimension (column, vocab: rows; row: columns); 1: whole.
  int tp_rank = 0;
  int tp_size = 1;
  /// Consecutive ranks of the tensor group that hold the same slice (declared by the
  /// layer; 1: every rank its own). Attention's key/value heads when parallel.tensor T
  /// exceeds model.n_kv_heads KV: R = T / KV ranks share each head (Megatron-LM replicates
  /// them), so tensor rank r holds slice tp_rank = r / R of tp_size = T / R.
  int tp_replicas = 1;
  /// Expert parallelism (layers/moe_dispatch.hpp): > 1 for a routed expert's tensor held
  /// by the ranks of one expert slot only (1 / ep_size of the experts per rank): its
  /// gradient is summed over the expert-data group, not the data group.
  int ep_size = 1;
};

/// The logical (whole) shape of a parameter of which `s` may be a tensor-parallel slice.
tensor::Shape logical_shape(const ParamSpec& s);
/// The index in the logical tensor (row-major) of element j of the slice `s`.
std::uint64_t logical_index(const ParamSpec& s, std::uint64_t j);
/// Copies slice `s` (s.shape.numel() floats) out of the logical tensor `whole`.
void copy_slice_from_whole(const ParamSpec& s, const float* whole, float* slice);
/// Copies slice `s` into its place in the logical tensor `whole`.
void copy_slice_to_whole(const ParamSpec& s, const float* slice, float* whole);
/// Marks every split parameter of `specs` (declared by the layers as their slice) as slice
/// `rank` of `size` (a replicated slice, tp_replicas R > 1: slice rank / R of size / R).
/// Throws dst::Error for a rank outside [0, size) or an R that does not divide size.
void mark_tensor_slices(std::vector<ParamSpec>& specs, int rank, int size);

/// Standard deviation of every weight matrix at initialisation (Llama/DeepSeek-LLM
/// `initializer_range`); output projections (o_proj, down_proj) are further scaled by
/// 1/sqrt(2 * n_layers) so the residual stream's variance does not grow with depth
/// (GPT-2, Radford et al. 2019, section 2.3).
inline constexpr float kInitStd = 0.02f;

/// The parameters of the dense DeepSeek-LLM decoder, in state-dict order, with offsets:
/// each layer's parameter spec (lib/model/layers/), composed by Transformer
/// (model/transformer.hpp), which defines this function.
std::vector<ParamSpec> dense_parameter_layout(const config::ModelSection& m);

/// Elements of each flat buffer (padding included) that a ParamStore of `specs` holds:
/// what memory given to it from outside must hold.
std::size_t flat_buffer_elements(const std::vector<ParamSpec>& specs);

class ParamStore {
 public:
  /// Lays out `specs` (offsets are assigned here). In plan mode nothing is allocated.
  /// The buffers live in the memory of `ctx`'s back end (host, or the CUDA device).
  /// `gradient_memory` (allocate mode, host only): the gradient buffer is this memory of
  /// flat_buffer_elements() f32, zero-filled, owned by the caller (comm::SharedSum's
  /// shared memory), instead of an allocation of the store's own. `param_memory`, the
  /// same for the parameter buffer (where the data group gathers the parameters each rank
  /// updated, comm::SharedSum::igather).
  ParamStore(std::vector<ParamSpec> specs, tensor::Arena::Mode mode, tensor::ExecContext ctx = {},
             float* gradient_memory = nullptr, float* param_memory = nullptr);

  std::size_t size() const { return specs_.size(); }
  const ParamSpec& spec(std::size_t i) const { return specs_[i]; }
  const std::vector<ParamSpec>& specs() const { return specs_; }
  /// Index of a parameter by name; throws dst::Error if absent.
  std::size_t index_of(const std::string& name) const;

  tensor::Tensor param(std::size_t i) const;
  tensor::Tensor grad(std::size_t i) const;
  tensor::Tensor param(const std::string& name) const { return param(index_of(name)); }
  tensor::Tensor grad(const std::string& name) const { return grad(index_of(name)); }

  /// Number of parameters (sum of numel, without alignment padding).
  std::int64_t parameter_count() const { return parameter_count_; }
  /// Elements in each flat buffer, padding included.
  std::size_t buffer_elements() const { return buffer_elements_; }
  /// The flat buffers, in the memory of context()'s back end (device pointers on CUDA).
  float* params_data() const { return static_cast<float*>(params_.base()); }
  float* grads_data() const { return static_cast<float*>(grads_.base()); }
  /// Both flat buffers as one-dimensional tensors of buffer_elements().
  tensor::Tensor params_flat() const;
  tensor::Tensor grads_flat() const;
  bool planning() const { return params_.planning(); }
  /// The back end (and stream) whose memory holds the buffers.
  const tensor::ExecContext& context() const { return ctx_; }

  /// Deterministic initialisation: element j of tensor `name` is
  /// std * normal(seed, hash_name(name), j), so any rank, thread count or slice order
  /// produces the same bits (a tensor-parallel slice draws its elements' logical indices,
  /// logical_index: the same values as the whole tensor's). Computed on the host (and copied to a
  /// device buffer), on `threads` threads (0: every CPU the process may use, core::usable_cpus()).
  void initialize(std::uint64_t seed, unsigned threads = 0);
  /// Zeroes the gradient buffer.
  void zero_grads();

 private:
  std::vector<ParamSpec> specs_;
  std::int64_t parameter_count_ = 0;
  std::size_t buffer_elements_ = 0;
  tensor::ExecContext ctx_;
  tensor::Arena params_;
  tensor::Arena grads_;
};

}  // namespace dst::model
