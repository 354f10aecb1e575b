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
  float* m = nullptr;        ///< (buffer_elements) first moments, ParamStore layout
  float* v = nullptr;        ///< (buffer_elements) second moments, ParamStore layout
  std::size_t elements = 0;  ///< = ParamStore::buffer_elements(), padding included
  std::int64_t step = 0;     ///< optimizer steps taken (the next step is step + 1)
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
  /// dst::Error for a range outside the buffer.
  void step(const tensor::ExecContext& ctx, model::ParamStore& store, double lr, double grad_scale,
            std::size_t first, std::size_t last);

  std::int64_t step_count() const { return step_; }
  /// For a restore: the steps the checkpointed optimizer had taken (>= 0).
  void set_step_count(std::int64_t steps);

  /// Pointers to the moment buffers and the step count (writable: a restore fills them).
  AdamWState state() const;
  /// The moments of tensor i, views at spec(i).offset.
  tensor::Tensor m(std::size_t i) const;
  tensor::Tensor v(std::size_t i) const;

  const config::OptimizerSection& config() const { return opt_; }
  bool planning() const { return m_.planning(); }
  /// Bytes of the two moment buffers (what `check` reports as optimizer memory).
  std::size_t bytes() const { return m_.used_bytes() + v_.used_bytes(); }

 private:
  struct Range {
    std::size_t offset;
    tensor::Shape shape;
    bool decay;
  };
  tensor::Tensor view(const tensor::Arena& arena, std::size_t i) const;

  config::OptimizerSection opt_;
  std::vector<Range> ranges_;  ///< one per parameter tensor, in store order
  std::size_t elements_ = 0;
  std::int64_t step_ = 0;
  tensor::Arena m_;
  tensor::Arena v_;
};

}  // namespace dst::train
