#pragma once
/// \file optimizer.hpp
/// AdamW over the parameter store: fp32 moments in two flat buffers with the store's
/// layout (tensor i's moments at spec(i).offset, like its parameters and gradients), so
/// ZeRO shards and checkpoint hyperslabs of the moments are the same ranges as those of
/// the parameters.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "config/run_config.hpp"
#include "kernels/kernels.hpp"
#include "model/param_store.hpp"
#include "tensor/arena.hpp"
#include "tensor/context.hpp"
#include "tensor/tensor.hpp"

namespace dst::train {

/// What a checkpoint saves of the optimizer (and restores through AdamW::state()).
struct AdamWState {
  float* m = nullptr;        ///< (elements) first moments, ParamStore layout from `first`
  float* v = nullptr;        ///< (elements) second moments, ParamStore layout from `first`
  std::size_t first = 0;     ///< the flat-buffer offset of m[0] and v[0] (a ZeRO shard's)
  std::size_t elements = 0;  ///< ParamStore::buffer_elements() (padding included), or the
                             ///< shard's size
  std::int64_t step = 0;     ///< optimizer steps taken (the next step is step + 1)
  /// (elements) the fp32 master parameters of the shard, ParamStore layout from `first`,
  /// when the optimizer holds them (the ZeRO constructor with `master`); else nullptr.
  float* master = nullptr;
};

/// torch.optim.AdamW over every parameter tensor of a ParamStore, with one parameter
/// group's hyper-parameters (training.optimizer) except that tensors whose spec says
/// weight_decay = false (RMSNorm weights) are not decayed, as a second param group with
/// weight_decay 0 would do in PyTorch.
class AdamW {
 public:
  /// Lays out (plans, or allocates zeroed) the moments for `store`'s layout; nothing is
  /// allocated afterwards. In a planning store's mode nothing is allocated at all.
  AdamW(const config::OptimizerSection& opt, const model::ParamStore& store);
  /// ZeRO (parallel.zero_stage >= 1): moments for the flat-buffer elements [first, last)
  /// only, this rank's shard; step() may then update only elements within it. Throws
  /// dst::Error for a range outside the buffer. `master` (bf16/fp16 training): the
  /// optimizer also holds the fp32 master parameters of the shard (state().master, to be
  /// filled by the caller), and step() updates those instead of the store's parameter
  /// buffer, which then holds the rounded compute copy (docs/performance.md, "ZeRO").
  AdamW(const config::OptimizerSection& opt, const model::ParamStore& store, std::size_t first,
        std::size_t last, bool master = false);

  /// One step: increments the step count t, then for each tensor runs kernels::adamw_step
  /// at t with lr and grad_scale (multiplies every gradient first: 1 / loss scale times
  /// the clip factor). A step the trainer skips (non-finite gradients) is simply not
  /// called, so t counts the steps applied, as PyTorch's state["step"] does.
  /// Throws dst::Error if `store` does not have the layout the moments were made for.
  void step(const tensor::ExecContext& ctx, model::ParamStore& store, double lr,
            double grad_scale = 1.0);
  /// The same step over the flat-buffer elements [first, last) only: one data-parallel
  /// rank's part when the ranks of a node share the update (the trainer gathers the
  /// parameters afterwards); the other elements of the parameters and moments are left
  /// as they are. Element by element the arithmetic of step(), so the same bits. Throws
  /// dst::Error for a range outside the buffer. With a master shard (has_master()) the
  /// parameters updated are the master's, and `store`'s parameter buffer is not touched.
  void step(const tensor::ExecContext& ctx, model::ParamStore& store, double lr, double grad_scale,
            std::size_t first, std::size_t last);

  std::int64_t step_count() const { return step_; }
  /// For a restore: the steps the checkpointed optimizer had taken (>= 0).
  void set_step_count(std::int64_t steps);

  /// Pointers to the moment buffers and the step count (writable: a restore fills them).
  AdamWState state() const;
  /// True when the moments cover part of the buffer only (the ZeRO constructor).
  bool sharded() const { return first_ != 0 || last_ != elements_; }
  /// True when the optimizer holds the fp32 master parameters of its shard.
  bool has_master() const { return has_master_; }
  /// The moments of tensor i, views at spec(i).offset. Throws dst::Error for a tensor not
  /// wholly in the moments' range (sharded()).
  tensor::Tensor m(std::size_t i) const;
  tensor::Tensor v(std::size_t i) const;

  const config::OptimizerSection& config() const { return opt_; }
  bool planning() const { return m_.planning(); }
  /// Bytes of the two moment buffers (what `check` reports as optimizer memory).
  std::size_t bytes() const { return m_.used_bytes() + v_.used_bytes(); }
  /// Bytes of the master shard (0 without one).
  std::size_t master_bytes() const { return master_.used_bytes(); }

 private:
  struct Range {
    std::size_t offset;
    tensor::Shape shape;
    bool decay;
  };
  tensor::Tensor view(const tensor::Arena& arena, std::size_t i) const;
  /// Elements [a, b) of a moment buffer (within [first_, last_)) as a 1-d tensor.
  tensor::Tensor piece(const tensor::Arena& arena, std::size_t a, std::size_t b) const;

  config::OptimizerSection opt_;
  std::vector<Range> ranges_;         ///< one per parameter tensor, in store order
  std::size_t elements_ = 0;          ///< of the parameter store's flat buffers
  std::size_t first_ = 0, last_ = 0;  ///< the moments' range of them
  std::int64_t step_ = 0;
  bool has_master_ = false;
  tensor::Arena m_;
  tensor::Arena v_;
  tensor::Arena master_;  ///< the shard's fp32 master parameters (has_master_), else empty
};

}  // namespace dst::train
