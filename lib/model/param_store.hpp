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
/// scheme, Shoeybi et al. 2019). Each layer records it with its parameters; nothing
/// splits by it yet.
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
  Split split = Split::replicated;  ///< how tensor parallelism would split it
};

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
  /// produces the same bits. Computed on the host (and copied to a device buffer), on
  /// `threads` threads (0: every CPU the process may use, core::usable_cpus()).
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
