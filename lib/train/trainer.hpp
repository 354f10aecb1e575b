#pragma once
/// \file trainer.hpp
/// Training, one optimizer step at a time (docs/architecture.md, "one optimizer step, end
/// to end"): this rank's micro-batches of the global batch, forward+backward (in turn, or
/// on the pipeline executor's schedule) accumulating into the flat gradient buffer, the
/// gradients' sums started during the last backward (GradSync), the global loss and
/// token count in one small all-reduce, the whole model's gradient norm (GlobalNorm), the
/// non-finite and fp16 overflow policy, clipping and AdamW at the schedule's learning
/// rate (GradSync::update), the MoE balance (MoeBalancer). The parts own their state; the
/// Trainer wires them to the model and runs the step.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/checkpoint.hpp"
#include "comm/process_groups.hpp"
#include "config/run_config.hpp"
#include "data/sample_store.hpp"
#include "model/language_model.hpp"
#include "model/layers/moe_dispatch.hpp"
#include "model/layers/tensor_parallel.hpp"
#include "runtime/runtime.hpp"
#include "runtime/startup_watchdog.hpp"
#include "tensor/context.hpp"
#include "train/checkpoint_state.hpp"
#include "train/consistency.hpp"
#include "train/faults.hpp"
#include "train/global_norm.hpp"
#include "train/grad_norm.hpp"
#include "train/grad_sync.hpp"
#include "train/loss_scaler.hpp"
#include "train/moe_balancer.hpp"
#include "train/nonfinite.hpp"
#include "train/pipeline_executor.hpp"
#include "train/step_stats.hpp"
#include "train/whole_model.hpp"
#include "train/work_spread.hpp"

namespace dst::train {

class Trainer {
 public:
  /// How the trainer is set up beyond the deck.
  struct Options {
    /// The back end the model runs on; its memory holds parameters, gradients, moments.
    tensor::ExecContext ctx;
    /// How the data group's gradients are summed (the resolved parallel.backend):
    ///  - mpi: over groups.data (MPI);
    ///  - nccl: over an NCCL communicator of groups.data on ctx.stream, made here (the
    ///    small host-side reductions, loss and flags, still use groups.data);
    ///  - shm: in shared memory of the data group (its ranks share one node), made here:
    ///    the gradients live there and are summed there, the parameters too, and the
    ///    ranks share the update: each runs AdamW on its part of the flat buffers
    ///    (SharedSum::part_of) and the parameters are gathered in place; the moments
    ///    outside a rank's part are gathered only for a checkpoint (docs/performance.md,
    ///    "the optimizer shared by the ranks of a node").
    ///  With parallel.zero_stage >= 1 (host memory only; docs/performance.md, "ZeRO"):
    ///  mpi reduce-scatters the gradients onto shards of whole tensors (ZeroShards::
    ///  by_tensors), updates the shard and all-gathers the parameters; shm keeps its sums
    ///  and gathers and allocates the moments of the rank's part only.
    runtime::CommBackend grad_comm = runtime::CommBackend::mpi;
    /// Names the start-up steps that make the NCCL communicator or the shared buffers
    /// (a rank that does not arrive ends the job naming the step); none when null.
    runtime::StartupWatchdog* watchdog = nullptr;
  };

  /// A trainer over `train`'s samples (the store must outlive it); collective over the
  /// process groups.
  Trainer(const config::RunConfig& config, const config::Layout& layout,
          comm::ProcessGroups& groups, data::SampleStore& train, Options options);
  Trainer(const config::RunConfig& config, const config::Layout& layout,
          comm::ProcessGroups& groups, data::SampleStore& train)
      : Trainer(config, layout, groups, train, Options{}) {}
  ~Trainer();

  /// Deterministic initial parameters from run.seed (identical on every rank).
  void initialize_parameters();
  /// Runs the next optimizer step.
  StepStats step();
  /// Mean loss over `batches` micro-batches per data rank of `store` (samples in order,
  /// wrapping around), across all ranks. Returns {mean loss, tokens}.
  std::pair<double, std::int64_t> evaluate(data::SampleStore& store, std::int64_t batches);
  /// Hashes the parameters on every rank and compares: throws dst::Error naming the first
  /// tensor that differs and the ranks, if any does.
  void check_consistency();

  /// How the ranks' work per step spread over a run of steps (train::work_spread over the
  /// world; `work_s`, `comm_s`: this rank's work and exposed communication per step).
  using WorkSpread = train::WorkSpread;
  WorkSpread work_spread(const std::vector<double>& work_s, const std::vector<double>& comm_s) {
    return train::work_spread(*groups_.world, work_s, comm_s);
  }

  /// The training state a checkpoint holds, for a streamed save (ckpt::Directory::save
  /// with a source): every parameter and both AdamW moments of the whole model as named
  /// tensors in the order of a one-stage run, whatever the layout (CheckpointState::
  /// stream: collective over every rank; sharded or shared moments gathered first).
  /// `params_only`: the parameters alone (final-params.h5).
  using CheckpointStream = train::CheckpointStream;
  CheckpointStream checkpoint_stream(bool params_only = false) const;
  /// The scalars of the state (step, sampler position, samples seen, optimizer and
  /// skipped steps, seed, layout); the caller adds the deck and version texts.
  ckpt::Metadata checkpoint_metadata() const;
  /// Continues from an open checkpoint (collective): checks that its tensors are this
  /// model's (one CheckpointError(mismatch) listing every missing, extra or reshaped
  /// tensor), reads parameters and moments (checksums verified), and sets the step, the
  /// optimizer's step count, the skipped-step count and the sampler position. The global
  /// batch may differ from the saved one (the sampler continues at the saved sample).
  void restore(ckpt::Reader& reader);

  std::int64_t steps_done() const { return step_; }
  std::int64_t skipped_steps() const { return skipped_; }
  /// training.precision fp16: the dynamic loss scale is in use (loss_scaler()).
  bool loss_scaling() const { return loss_scaling_; }
  /// The dynamic loss scaler (state meaningful only when loss_scaling()).
  const LossScaler& loss_scaler() const { return scaler_; }
  model::LanguageModel& model() { return *model_; }
  /// The whole model's parameter layout (names, whole shapes, offsets of a flat buffer):
  /// the model's own store, or with pipeline stages or tensor slices a store of the whole
  /// model built only to plan.
  const model::ParamStore& logical_parameters() const {
    return whole_->layout() ? *whole_->layout() : model_->params();
  }
  const tensor::ExecContext& context() const { return ctx_; }
  /// The training order: the run's one sampler (through the batch source).
  const data::Sampler& sampler() const { return batches_->sampler(); }
  /// Reads the training samples ahead for at most `steps` more steps (data::BatchSource).
  void read_ahead(std::int64_t steps) { batches_->read_ahead(steps); }
  /// The deck's fault injection as it applies to this rank.
  const Faults& faults() const { return faults_; }
  /// debug.inject_hang_alltoallv_rank: this rank hangs in the next expert all-to-all-v.
  void arm_alltoallv_hang();
  /// Expert parallelism's storage is in effect: each rank holds its own routed experts
  /// only (with ZeRO, their state sharded over the expert-data group).
  bool own_experts_only() const { return expert_storage_; }

 private:
  // --- the phases of step()
  /// Multi-token prediction: sets the MTP loss's weight from the global batch's target
  /// counts (one all-reduce over the data group); returns the MTP targets (0 without it).
  double weigh_mtp_loss();
  /// What this rank's forwards and backwards added up.
  struct Passes {
    double loss_sum = 0.0;
    double aux_sum = 0.0;  ///< DeepSeekMoE's balance loss, summed over sequences and blocks
    double mtp_sum = 0.0;  ///< the MTP module's loss sum
    std::int64_t valid = 0;
  };
  /// The step's micro-batches (one stage: in turn; stages: the pipeline executor's
  /// schedule) with the gradient buckets started during the last backward and waited;
  /// the phase timers and the layers' traffic into `st`.
  Passes forward_backward(float backward_scale, StepStats& st);
  /// The global sums the step needs beyond `st`'s loss, tokens, stop requests and MTP loss.
  struct Sums {
    double tokens = 0.0;           ///< target tokens of the global batch
    double nonfinite_ranks = 0.0;  ///< ranks whose own gradient had a NaN or infinity
  };
  /// The loss, token count, non-finite and stop flags (and MTP loss) summed over the data
  /// group and the stages, the flags over the tensor slices; fills st.loss, tokens,
  /// stop_ranks, mtp and mtp_loss.
  Sums sum_over_ranks(const Passes& passes, double mtp_tokens, StepStats& st);
  /// The whole model's squared gradient norm (unscaled), collective like the step.
  double gradient_norm_squared();
  /// fp16: the step skipped for an overflow, the loss scale halved.
  void skip_overflow(StepStats& st, double nonfinite_ranks);
  /// Non-finite gradients (debug.nan_policy skip): the step skipped, its cause named;
  /// throws CollectiveError (exit 6) under nan_policy abort.
  void skip_nonfinite(StepStats& st);
  /// Clipping and the optimizer's step on what this rank updates, the parameters gathered
  /// (shm, ZeRO) and the compute copy refreshed; returns the seconds of the gather.
  double update(StepStats& st, double grad_scale);
  /// debug.inject_divergence_rank: moves one parameter of this rank, as a diverged replica
  /// would.
  void diverge();

  const config::RunConfig& cfg_;
  config::Layout layout_;
  comm::ProcessGroups& groups_;
  tensor::ExecContext ctx_;
  Faults faults_;
  /// How the gradients become the update; it holds the memory the model's store lives
  /// in (declared before model_, which it must outlive).
  std::unique_ptr<GradSync> sync_;
  std::unique_ptr<model::LanguageModel> model_;
  /// parallel.expert > 1 with an MoE model: the expert group the MoE layers dispatch over.
  std::unique_ptr<model::ExpertParallel> experts_;
  /// Expert parallelism's storage: this rank holds its own routed experts only
  /// (model::ExpertSlice), the last tensors of its store (GradSync::own_experts).
  bool expert_storage_ = false;
  /// parallel.tensor > 1: this rank's tensor group, which the layers reduce over.
  int tensor_ = 1;
  std::unique_ptr<model::TensorParallel> tensor_parallel_;
  /// check_consistency()'s comparison of every replica of this rank's parameters.
  std::unique_ptr<ConsistencyChecker> consistency_;
  /// Where this rank's tensors stand in the whole model, and the whole model's state for
  /// checkpoints from this rank's part.
  std::unique_ptr<WholeModel> whole_;
  std::unique_ptr<CheckpointState> checkpoint_;
  std::unique_ptr<data::BatchSource> batches_;
  GradNorm norm_;
  std::vector<std::int32_t> batch_;             ///< (micro_batches, micro_batch_size, T + 1)
  std::vector<std::int32_t> tokens_, targets_;  ///< (micro_batch_size, T)
  std::int64_t step_ = 0;
  std::int64_t skipped_ = 0;
  std::uint64_t samples_seen_ = 0;  ///< samples consumed since the start of training
  /// DeepSeekMoE after a step: the loads and the balance loss summed (MoeBalancer::reduce;
  /// `aux_sum`: this rank's, ignored with stages), the correction biases moved unless the
  /// step was skipped, st.aux_loss and st.moe. Collective over the data group and, with
  /// stages, the pipeline group: every stage calls it, also one without MoE blocks.
  void balance_moe(StepStats& st, double aux_sum);
  std::unique_ptr<MoeBalancer> balancer_;
  // --- pipeline parallelism (parallel.pipeline > 1; docs/performance.md) ------------------
  /// Stages, this rank's stage, and its model chunks (the interleaved schedule's V, else 1).
  int stages_ = 1, stage_ = 0;
  int chunks_ = 1;
  /// Tied embeddings or the MTP module with stages (model::stages_share_embedding): this
  /// rank holds the embedding table (stage 0) or its copy (the last stage), in both at
  /// offset 0 of the store, embedding_elements_ floats. Their gradients are summed over
  /// the two (PipelineExecutor::sum_embedding_copies) before the data group's reduction of them.
  bool embedding_copy_ = false;
  std::size_t embedding_elements_ = 0;
  /// Pipeline stages: the executor of this rank's schedule, and the model as its stage
  /// (trainer.cpp).
  std::unique_ptr<PipelineExecutor> pipeline_;
  class ModelStage;
  std::unique_ptr<ModelStage> model_stage_;
  /// The whole model's squared gradient norm from this rank's per-tensor sums.
  std::unique_ptr<GlobalNorm> global_norm_;
  /// Names where non-finite gradients arose (every layout).
  std::unique_ptr<NonFiniteNamer> nonfinite_;
  std::size_t poison_offset_ = 0;  ///< where Faults::gradient_poison goes
  bool loss_scaling_ = false;      ///< training.precision fp16
  LossScaler scaler_;
};

}  // namespace dst::train
