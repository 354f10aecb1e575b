#pragma once
/// \file moe.hpp
/// The DeepSeekMoE feed-forward layer (DeepSeek-V2/V3), as transformers' DeepseekV3MoE:
///   out = shared(x) + sum_k w_k expert_{i_k}(x)
/// with n_shared_experts shared experts as one SwiGLU of width n_shared x
/// moe_intermediate_size (an Mlp), n_routed_experts routed SwiGLU experts of width
/// moe_intermediate_size, and the router of moe_router.hpp choosing the top-k experts
/// i_k and their weights w_k per token. Dropless by default: every token reaches its k
/// experts; with model.moe.capacity_factor f > 0 each expert takes at most ceil(f N K / E)
/// rows of the N tokens of a forward (apply_capacity), decided on each rank before any
/// dispatch: a dropped row is neither computed nor sent, its output is 0 (its weight acts
/// as 0, forward and backward), and the token keeps its shared experts and residual.
/// The routed products are grouped: the N*K (token, slot) rows are sorted by expert
/// (sort_by_expert) and each expert runs one product over its rows.
///
/// The router and the token sort run on the host over a copy of the (N, E) logits (small
/// next to the expert products); the rows' bookkeeping (MoeActs token, row, weights) goes
/// back to the context's memory, where the gather, the expert products and the combine run
/// as kernels (kernels.hpp, "DeepSeekMoE token movement"), on the host or a CUDA device.
/// The router's weight is read in fp32 (the master weights), as transformers computes it.
/// Balancing: the router's correction bias (sigmoid scoring) is a parameter of the
/// layout (in checkpoints) without gradients, moved by update_bias(); each forward adds its
/// tokens' expert choices to the layer's load counts (MoeActs::routing->load).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config/run_config.hpp"
#include "model/layers/layer.hpp"
#include "model/layers/mlp.hpp"
#include "model/layers/moe_dispatch.hpp"
#include "model/layers/moe_router.hpp"
#include "tensor/arena.hpp"

namespace dst::model {

/// The host-side routing of the last forward, and the loads counted since the last
/// balancing update.
struct MoeRouting {
  std::vector<float> logits;      // (N, E) the router logits' host copy; backward: gradient
  std::vector<float> bias;        // (E) the choice correction's host copy (sigmoid router)
  std::vector<float> scores;      // (N, E) router scores s
  std::vector<std::int32_t> idx;  // (N, K) chosen experts
  std::vector<float> weights;     // (N, K) their weights
  std::vector<float> d_weights;   // (N, K) backward: d(loss)/d(weights)
  std::vector<float> d_scores;    // (N, E) backward: the balance loss's score gradient
  ExpertRows rows;                // the grouped products' rows
  std::vector<double> load;       // (E) tokens routed to each expert since the last reset
  double dropped = 0.0;           // rows dropped by the capacity since the last reset
  double aux_loss = 0.0;          // the last forward's balance loss (summed over sequences)
  ExpertDispatch dispatch;        // expert parallelism: the last forward's exchange
};

/// What the MoE layer keeps from forward for backward (with its input).
struct MoeActs {
  MlpActs shared;                       // (N, S*I) x3: the shared experts (no buffers when S = 0)
  tensor::Tensor logits;                // (N, E) router logits; backward: their gradient
  tensor::Tensor xs;                    // (N*K, C) the input rows, sorted by expert
  tensor::Tensor h1, h3, g;             // (N*K, I) the routed experts' SwiGLU
  tensor::Tensor y;                     // (N*K, C) the routed experts' outputs
  tensor::Tensor token;                 // (N*K) i32 the token of each sorted row
  tensor::Tensor row;                   // (N, K) i32 the sorted row of token n's slot k
  tensor::Tensor weights;               // (N, K) the chosen experts' weights
  std::shared_ptr<MoeRouting> routing;  // host state; nullptr in a planning layout
};

/// Backward scratch, shared by every MoE layer of the model.
struct MoeScratch {
  MlpScratch shared;         // (N, S*I)
  tensor::Tensor d_g;        // (N*K, I)
  tensor::Tensor d_y;        // (N*K, C) gradient of the expert outputs
  tensor::Tensor d_xs;       // (N*K, C) gradient of the sorted input rows
  tensor::Tensor d_weights;  // (N, K) gradient of the chosen experts' weights
};

class Moe {
 public:
  /// `prefix`: the parameter names' ("model.layers.1.mlp."). `out_std`: the experts'
  /// down_proj initial standard deviation. `ep`: expert parallelism's storage: the layer
  /// holds experts [ep.rank L, (ep.rank+1) L) only, L = n_routed_experts / ep.size
  /// (moe_dispatch.hpp); {0, 1}: every expert. Throws dst::Error if ep.size does not divide
  /// n_routed_experts or ep.rank is outside [0, ep.size).
  Moe(std::string prefix, const config::ModelSection& m, float out_std, const ExpertSlice& ep = {});

  /// experts.<e>.{gate,up,down}_proj for each routed expert held here (the published checkpoints'
  /// names; transformers fuses them into experts.gate_up_proj / down_proj when loading),
  /// gate.weight (E, C), gate.e_score_correction_bias (E, zeros, sigmoid scoring only),
  /// shared_experts.{gate,up,down}_proj (when n_shared_experts > 0).
  void declare(std::vector<ParamSpec>& specs) const;
  void bind(const ParamStore& params);

  /// `allocate`: whether the record's host routing state is made (not in a planning pass).
  MoeActs take(tensor::Arena& arena, std::int64_t rows, bool allocate) const;
  /// The host routing state of a record of `rows` tokens (loads zero).
  std::shared_ptr<MoeRouting> make_routing(std::int64_t rows) const;
  /// The bytes of make_routing(rows) with its expert rows sorted: host memory outside
  /// the arenas (the plan counts it with the activations).
  std::uint64_t routing_bytes(std::int64_t rows) const;
  MoeScratch take_scratch(tensor::Arena& arena, std::int64_t rows) const;

  /// out (N, C) = the layer of x (N, C), B sequences of T tokens (the balance loss is per
  /// sequence); keeps a, adds the choices to a.routing->load (unless `count` is false: a
  /// recomputed forward, whose choices were counted) and sets the balance loss in
  /// a.routing->aux_loss.
  void forward(const Compute& c, std::int64_t B, std::int64_t T, const tensor::Tensor& x,
               const MoeActs& a, const tensor::Tensor& out, bool count = true) const;
  /// dx (N, C) = d(loss)/dx (written) from dout (N, C), rounded in place to the storage
  /// type; accumulates the weights' gradients (the balance loss's, scaled by
  /// c.aux_grad_scale, included).
  void backward(const Compute& c, std::int64_t B, std::int64_t T, const tensor::Tensor& dout,
                const tensor::Tensor& x, const MoeActs& a, const MoeScratch& s,
                const tensor::Tensor& dx) const;

  /// Auxiliary-loss-free balancing (DeepSeek-V3 report, 2.1.2): b_e -= rate *
  /// sign(load_e - mean load) for the layer's correction bias in `params` (master weights),
  /// from `load` (E) counted over the whole batch. Nothing without a bias (softmax).
  void update_bias(const ParamStore& params, const std::vector<double>& load, double rate) const;
  std::int64_t experts() const { return E_; }
  /// The routed experts this layer holds: [first_local_expert(), + local_experts()).
  std::int64_t first_local_expert() const { return ep_first_; }
  std::int64_t local_experts() const { return ep_count_; }
  /// The expert slice it was built for.
  const ExpertSlice& expert_slice() const { return ep_; }
  /// Checks a node map for node-limited routing (Compute::expert_node: the node of each
  /// routed expert; empty: one node): throws dst::Error if it has not E entries, if the
  /// ids are not 0 .. nodes - 1 each used, or if model.moe.max_nodes_per_token of the
  /// nodes cannot hold top-k experts.
  void check_expert_nodes(const std::vector<std::int32_t>& expert_node) const;
  bool has_bias() const { return shape_.score == config::MoeScore::sigmoid; }
  /// The correction bias's parameter index (has_bias() only).
  std::size_t bias_index() const { return bias_; }
  /// The parameters the router reads from the master parameters in fp32 (forward's
  /// c.params, not the compute copy): gate.weight, and the correction bias if any.
  std::vector<std::size_t> router_params() const {
    return has_bias() ? std::vector<std::size_t>{gate_, bias_} : std::vector<std::size_t>{gate_};
  }

 private:
  /// Expert parallelism: the routed products of the rows in a.xs (sorted by expert) on
  /// their experts' ranks, their outputs back into a.y (forward); the gradients of a.y's
  /// rows in s.d_y to the experts' ranks, the rows' input gradients back into s.d_xs
  /// (backward). Collective over c.experts.
  /// `overlap` (the shared experts' part) runs while the rows travel to the experts.
  void experts_forward(const Compute& c, const MoeActs& a, bool count,
                       const std::function<void()>& overlap) const;
  void experts_backward(const Compute& c, const MoeActs& a, const MoeScratch& s,
                        const std::function<void()>& overlap) const;
  /// The SwiGLU of experts first .. first + L - 1 over their rows, expert first + l's
  /// rows [offset[l], offset[l + 1]) of xs: h1 = xs W1^T, h3 = xs W3^T, g = silu(h1) h3,
  /// y = g W2^T (experts without rows skipped). `offset` has L + 1 entries.
  void swiglu_rows_forward(const Compute& c, const std::vector<std::int64_t>& offset,
                           std::int64_t first, const tensor::Tensor& xs, const tensor::Tensor& h1,
                           const tensor::Tensor& h3, const tensor::Tensor& g,
                           const tensor::Tensor& y) const;
  /// Its backward from dy: dg, then d_h1, d_h3 overwriting h1, h3 (as Mlp's), dxs written;
  /// the experts' weight gradients accumulated.
  void swiglu_rows_backward(const Compute& c, const std::vector<std::int64_t>& offset,
                            std::int64_t first, const tensor::Tensor& xs, const tensor::Tensor& h1,
                            const tensor::Tensor& h3, const tensor::Tensor& g,
                            const tensor::Tensor& dy, const tensor::Tensor& dg,
                            const tensor::Tensor& dxs) const;
  std::string prefix_;
  std::int64_t C_, E_, K_, I_, S_;
  RouterShape shape_;
  double aux_alpha_;
  double capacity_factor_;
  float out_std_;
  Mlp shared_;
  ExpertSlice ep_;
  std::int64_t ep_first_ = 0, ep_count_ = 0;  // the experts held here
  /// The parameter index of held expert e (global id) in w (w1_, w3_ or w2_).
  std::size_t expert_param(const std::vector<std::size_t>& w, std::int64_t e) const;
  std::vector<std::size_t> w1_, w3_, w2_;  // (local_experts()) the held experts' parameters
  std::size_t gate_ = 0, bias_ = 0;
};

}  // namespace dst::model
