#pragma once
/// \file layer.hpp
/// What every layer of the model (embedding, rmsnorm, attention, mlp, head; block.hpp
/// composes them) shares: the context it computes in (Compute), how it adds its
/// parameters to the model's layout, and row views of activations.
///
/// A layer kind is a class with its parameter spec (declare(): names, shapes, init and
/// tensor-parallel split, appended in state-dict order; bind(): the indices of those names
/// in a ParamStore), a forward, a backward, and its activation record (a struct of the
/// tensors the forward keeps for the backward, taken from an arena by take()).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.hpp"
#include "model/param_store.hpp"
#include "tensor/context.hpp"
#include "tensor/tensor.hpp"

namespace dst::model {

class ExpertParallel;  // layers/moe_dispatch.hpp
class TensorParallel;  // layers/tensor_parallel.hpp

/// The context the layers compute in: the back end, the storage type the run emulates
/// (docs/precision.md), and the parameters they read and whose gradients they accumulate.
struct Compute {
  tensor::ExecContext ctx;
  /// f32, or bf16 / f16: activations are rounded to it where a 16-bit back end would
  /// store them (store()), and the weights are read from the rounded compute copy.
  DType storage = DType::f32;
  const ParamStore* params = nullptr;
  /// (params->buffer_elements()) the master parameters rounded to `storage`, in the
  /// store's layout; nullptr: the layers read the master parameters (f32).
  float* compute_base = nullptr;
  /// The weight of each sequence's MoE balance loss in the gradient: the cross-entropy's
  /// grad_scale times the sequence length T, so it counts like T tokens' losses (with
  /// grad_scale = 1 / tokens of the global batch: the mean over its sequences).
  /// LanguageModel::forward_backward sets it.
  float aux_grad_scale = 0.0f;
  /// Expert parallelism (parallel.expert > 1, layers/moe_dispatch.hpp): the expert group
  /// the MoE layers dispatch their tokens over; nullptr (or a group of one): every rank
  /// computes every expert, with no communication.
  ExpertParallel* experts = nullptr;
  /// Tensor parallelism (parallel.tensor > 1, layers/tensor_parallel.hpp): the tensor group
  /// whose ranks each compute their slice of the layers; nullptr: the whole layers here.
  TensorParallel* tensor = nullptr;
  /// Node-limited routing (model.moe.max_nodes_per_token): the node of each routed expert
  /// (RouterShape::expert_node); nullptr: every expert on one node (no limit).
  const std::vector<std::int32_t>* expert_node = nullptr;
  /// Sequence parallelism (block.hpp): the attention and the MLP leave their partial sums
  /// over the tensor group as they are (reduce_partial() does nothing) for the block to
  /// reduce-scatter by token rows. Set on the block's copy of the context only.
  bool keep_partial = false;

  /// The weights of parameter `i` the forward and backward compute with: the master
  /// parameter (f32), or its rounded compute copy (bf16/f16).
  tensor::Tensor weight(std::size_t i) const;
  /// The fp32 gradient of parameter `i` (accumulated into by the backward).
  tensor::Tensor grad(std::size_t i) const { return params->grad(i); }
  /// Where parameter `i` starts in the flat buffers (what OnReady reports).
  std::size_t offset(std::size_t i) const { return params->spec(i).offset; }
  /// Where a 16-bit back end would store `t` (an activation, or an activation's gradient
  /// that feeds a matrix product): rounds it to the storage type. Nothing for f32. The
  /// one place the model's emulated precision is applied to activations.
  void store(const tensor::Tensor& t) const;
  /// Tensor parallelism: `t`, this rank's partial sum (a row-parallel product's output, a
  /// column-parallel product's input gradient), becomes the sum over the tensor group, on
  /// every rank. Nothing without a tensor group, or with keep_partial.
  void reduce_partial(const tensor::Tensor& t) const;
  /// Tensor parallelism with key/value heads shared by several ranks (T > model.n_kv_heads):
  /// `t`, this rank's share of a shared head's activation gradient, becomes the sum over
  /// the ranks sharing it. Nothing without such ranks.
  void reduce_kv_replicas(const tensor::Tensor& t) const;
  /// Tensor parallelism: `t`, this rank's share of the gradient of an activation every
  /// rank computes alike (latent attention's latents), becomes the sum over the tensor
  /// group, also under sequence parallelism (keep_partial). Nothing without a group.
  void reduce_replicated(const tensor::Tensor& t) const;
  /// This rank's place in the tensor group (0 without one).
  int tensor_rank() const;
};

/// Called during backward each time the gradients of every parameter at flat-buffer
/// offsets >= the argument are final for this micro-batch (LanguageModel::forward_backward).
using OnReady = std::function<void(std::size_t)>;

/// Appends a parameter to a layout (the offset is assigned by the ParamStore).
void add_param(std::vector<ParamSpec>& specs, std::string name, const tensor::Shape& shape,
               Init init, float std, bool weight_decay, Split split);

/// Rows [first, first + n) of a 1-D or 2-D tensor (rows are contiguous).
tensor::Tensor row_range(const tensor::Tensor& t, std::int64_t first, std::int64_t n);

}  // namespace dst::model
