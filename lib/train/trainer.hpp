#pragma once
/// \file trainer.hpp
/// Data-parallel training, one optimizer step at a time (ARCHITECTURE.md, "one optimizer
/// step, end to end"): this rank's micro-batches of the global batch, forward+backward
/// accumulating into the flat gradient buffer, the gradient all-reduce in buckets started
/// during the last micro-batch's backward, the global loss and token count in one small
/// all-reduce, the gradient norm, the non-finite policy, clipping, AdamW at the
/// schedule's learning rate.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "ckpt/checkpoint.hpp"
#include "comm/process_groups.hpp"
#include "config/run_config.hpp"
#include "data/sample_store.hpp"
#include "model/dense_model.hpp"
#include "model/layers/moe_dispatch.hpp"
#include "model/layers/tensor_parallel.hpp"
#include "runtime/runtime.hpp"
#include "runtime/startup_watchdog.hpp"
#include "tensor/context.hpp"
#include "train/consistency.hpp"
#include "train/faults.hpp"
#include "train/global_norm.hpp"
#include "train/grad_buckets.hpp"
#include "train/grad_norm.hpp"
#include "train/loss_scaler.hpp"
#include "train/moe_balancer.hpp"
#include "train/nonfinite.hpp"
#include "train/optimizer.hpp"
#include "train/pipeline_executor.hpp"
#include "train/step_stats.hpp"
#include "train/zero_shards.hpp"

namespace dst::train {

/// Step by step, how far the ranks' work (data + forward + backward) lay apart, and how
/// much of one rank's exposed communication was waiting for a slower rank's work rather
/// than the gradients' own sum. Means over the steps, seconds.
struct StepSpread {
  /// slowest rank's work - fastest rank's work
  double straggle_s = 0.0;
  /// this rank's: min(its exposed communication, slowest rank's work - its own work). The
  /// ranks start a step together (the previous step ends in a collective), so until the
  /// slowest rank's work is done no sum can complete: that much of the wait is the peer's,
  /// whatever the network; the rest of the exposed communication is the sum's own tail.
  double peer_wait_s = 0.0;
};
/// StepSpread from this rank's work and exposed communication per step and every step's
/// highest and lowest work over the ranks (vectors of one length; empty gives zeros).
StepSpread step_spread(const std::vector<double>& own_work, const std::vector<double>& own_comm,
                       const std::vector<double>& max_work, const std::vector<double>& min_work);

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

  /// How a rank's work per step (data + forward + backward: what it does before it waits
  /// for its peers' gradients) compares across the ranks, over a run of steps. `work_s`
  /// and `comm_s`: this rank's work and exposed communication (StepStats::t_comm) of each
  /// of those steps, the same steps on every rank. Collective over every rank (two
  /// all-reduces: 2 x steps + 2 doubles, one integer).
  struct WorkSpread {
    double min_s = 0.0, max_s = 0.0;  ///< the ranks' mean work per step: lowest, highest
    int slowest_rank = 0;             ///< the lowest rank with max_s
    StepSpread per_step;              ///< step by step (a slow rank that changes from step
                                      ///< to step evens out in the means above, not here)
  };
  WorkSpread work_spread(const std::vector<double>& work_s, const std::vector<double>& comm_s);

  /// The training state a checkpoint holds, for a streamed save (ckpt::Directory::save
  /// with a source): every parameter and both AdamW moments of the whole model as named
  /// tensors ("params/<name>", "optimizer/exp_avg/<name>", "optimizer/exp_avg_sq/<name>"),
  /// in the order of a one-stage run; `tensors` gives the names and shapes (no data),
  /// `source(i)` tensor i whole, collectively over every rank (valid until the next call
  /// and the next step). With one stage and no tensor slices the source returns views of
  /// the flat buffers (on a device, of host copies taken by this call). With pipeline
  /// stages or tensor slices it assembles one tensor at a time (the slices all-gathered
  /// over the tensor group, then broadcast from its stage over the pipeline group), so a
  /// save holds one whole tensor beyond the rank's own state; per-rank experts
  /// (parallel.expert) are broadcast from the rank that holds them over the expert group.
  /// Where the ranks share the
  /// update, or under ZeRO, this call first gathers the moments of the other ranks' parts
  /// (collective over the data group; under ZeRO into host buffers of the stage slice's
  /// size, held until the next step; with bf16/fp16 the master parameters too).
  /// `params_only`: the parameters alone (final-params.h5).
  struct CheckpointStream {
    std::vector<ckpt::TensorRef> tensors;
    std::function<const float*(std::size_t)> source;
  };
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
  model::DenseModel& model() { return *model_; }
  /// The whole model's parameter layout (names, whole shapes, offsets of a flat buffer):
  /// the model's own store, or with pipeline stages or tensor slices a store of the whole
  /// model built only to plan.
  const model::ParamStore& logical_parameters() const {
    return full_layout_ ? *full_layout_ : model_->params();
  }
  const AdamW& optimizer() const { return *optimizer_; }
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
  /// ZeRO over MPI (shards of whole tensors, parameters all-gathered), not over shm.
  bool zero_over_mpi() const { return zero_stage_ > 0 && !shared_; }

  /// This rank's own state tensors (its stage's, its slices), in its store's order:
  /// params, then first moments, then second; with the device's state copied into the
  /// host buffers (for a save) or not (for restore(), which reads into them and copies
  /// them up).
  std::vector<ckpt::TensorRef> state_tensors(bool copy_from_device) const;
  /// The whole model's state tensors' names and whole shapes (no data) in the order of a
  /// one-stage checkpoint, and in `owner` the stage holding each.
  std::vector<ckpt::TensorRef> whole_model_tensors(bool params_only, std::vector<int>& owner) const;
  static std::unordered_map<std::string, std::size_t> index_by_name(
      const std::vector<ckpt::TensorRef>& tensors);
  const config::RunConfig& cfg_;
  config::Layout layout_;
  comm::ProcessGroups& groups_;
  tensor::ExecContext ctx_;
  Faults faults_;
  /// Made here for Options::grad_comm nccl and shm (before the model, which lives in the
  /// shared buffers).
  std::unique_ptr<comm::Communicator> device_comm_;
  std::unique_ptr<comm::SharedSum> shared_;
  /// ZeRO stage 2 over MPI: the model's gradient memory, mapped untouched (declared
  /// before model_, which it must outlive).
  std::shared_ptr<void> grad_pages_;
  std::unique_ptr<model::DenseModel> model_;
  /// parallel.expert > 1 with an MoE model: the expert group the MoE layers dispatch over.
  std::unique_ptr<model::ExpertParallel> experts_;
  /// parallel.tensor > 1: this rank's tensor group, which the layers reduce over.
  int tensor_ = 1;
  std::unique_ptr<model::TensorParallel> tensor_parallel_;
  /// check_consistency()'s comparison of every replica of this rank's parameters.
  std::unique_ptr<ConsistencyChecker> consistency_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<data::BatchSource> batches_;
  GradNorm norm_;
  std::vector<std::int32_t> batch_;             ///< (micro_batches, micro_batch_size, T + 1)
  std::vector<std::int32_t> tokens_, targets_;  ///< (micro_batch_size, T)
  std::int64_t step_ = 0;
  std::int64_t skipped_ = 0;
  std::uint64_t samples_seen_ = 0;        ///< samples consumed since the start of training
  std::unique_ptr<GradBuckets> buckets_;  ///< ranges of the flat gradient buffer, made once
  /// The ranks of the node share the optimizer's update (see the constructor): the
  /// buffers, and the slot of the gathers.
  comm::SharedSum* shared_update_ = nullptr;
  std::size_t gather_slot_ = 0;
  /// Gathers the flat buffer `data` (the moments) across the shared ranks, through the
  /// gradient buffer (free between steps).
  void gather_state(float* data) const;
  /// ZeRO: the stage in effect (0 with one data rank), this rank's shard of the flat
  /// buffers, and all the ranks' shards.
  int zero_stage_ = 0;
  std::unique_ptr<ZeroShards> shards_;
  std::size_t shard_first_ = 0, shard_last_ = 0;
  /// ZeRO with bf16/fp16: the fp32 master exists only as this rank's shard (the
  /// optimizer's, AdamWState::master); the model's parameter buffer is the compute copy,
  /// and the all-gather gathers the compute copy's shards.
  bool master_shard_ = false;
  /// Gathers the master shards whole into `whole` (buffer_elements(), host memory).
  void gather_master(float* whole) const;
  /// Gathers every rank's shard of a flat buffer into `whole` (buffer_elements(), host
  /// memory) from this rank's shard `mine` of optimizer_ and, with per-rank experts,
  /// `mine_experts` of expert_optimizer_ (each part over its group).
  void gather_shards(float* whole, const float* mine, const float* mine_experts) const;
  /// ZeRO over MPI: all-gathers the updated parameters (this rank's shard final) bucket by
  /// bucket, the gradient buckets' ranges; returns the seconds it took.
  double gather_parameters();
  /// DeepSeekMoE after a step: the loads and the balance loss summed (MoeBalancer::reduce;
  /// `aux_sum`: this rank's, ignored with stages), the correction biases moved unless the
  /// step was skipped, st.aux_loss and st.moe. Collective over the data group and, with
  /// stages, the pipeline group: every stage calls it, also one without MoE blocks.
  void balance_moe(StepStats& st, double aux_sum);
  std::unique_ptr<MoeBalancer> balancer_;
  /// Moves every MoE block's correction bias by the step's `loads` (balance_moe's sums).
  /// With a master shard (ZeRO with bf16/fp16) the compute copy keeps the biases in fp32
  /// (DenseModel's master_outside), every rank moves them alike, and each element's owner
  /// copies the moved value into its master shard (the same bits as ZeRO stage 0).
  void move_moe_bias(const std::vector<double>& loads);
  // --- pipeline parallelism (parallel.pipeline > 1; docs/performance.md) ------------------
  /// Stages, this rank's stage, and its model chunks (the interleaved schedule's V, else 1).
  int stages_ = 1, stage_ = 0;
  int chunks_ = 1;
  /// The whole model's layout (plan mode), and each stage's parameter specs (offsets of
  /// its own store): a checkpoint's tensors are every stage's, gathered.
  std::unique_ptr<model::ParamStore> full_layout_;
  std::vector<std::vector<model::ParamSpec>> stage_specs_;
  /// Tied embeddings or the MTP module with stages (model::stages_share_embedding): this
  /// rank holds the embedding table (stage 0) or its copy (the last stage), in both at
  /// offset 0 of the store, embedding_elements_ floats. Their gradients are summed over
  /// the two (PipelineExecutor::sum_embedding_copies) before the data group's reduction of them.
  bool embedding_copy_ = false;
  std::size_t embedding_elements_ = 0;
  /// Whether stage s's tensor `name` is the last stage's copy of the embedding table.
  bool is_embedding_copy(int s, const std::string& name) const;
  /// Pipeline stages: the executor of this rank's schedule, and the model as its stage
  /// (trainer.cpp).
  std::unique_ptr<PipelineExecutor> pipeline_;
  class ModelStage;
  std::unique_ptr<ModelStage> model_stage_;
  /// The whole model's squared gradient norm from this rank's per-tensor sums.
  std::unique_ptr<GlobalNorm> global_norm_;
  /// Names where non-finite gradients arose (every layout).
  std::unique_ptr<NonFiniteNamer> nonfinite_;
  // --- expert parallelism's storage (parallel.expert > 1, MoE model; moe_dispatch.hpp) ---
  /// Each rank holds its own routed experts only (model::ExpertSlice): the store's tensors
  /// from expert_first_tensor_ on (flat offsets from expert_offset_) are those, summed over
  /// the expert-data group by expert_buckets_; buckets_ sums [0, expert_offset_) over the
  /// data group.
  bool expert_storage_ = false;
  std::size_t expert_first_tensor_ = 0, expert_offset_ = 0;
  /// Some pipeline stage stores its own experts (expert_storage_ is this rank's stage's).
  bool any_expert_storage_ = false;
  std::unique_ptr<GradBuckets> expert_buckets_;
  /// Sets expert_first_tensor_ and expert_offset_ from the store.
  void locate_own_experts();
  /// Makes buckets_ and expert_buckets_ over the two regions of the store.
  void make_expert_buckets(double bucket_bytes);
  /// ZeRO with per-rank experts: the own experts' part [expert_offset_, end) is sharded
  /// over the expert-data group (offsets relative to expert_offset_), shards_ covering
  /// [0, expert_offset_) over the data group; this rank's expert shard (absolute offsets)
  /// has its own moments (and master shard) in expert_optimizer_, which steps with
  /// optimizer_.
  std::unique_ptr<ZeroShards> expert_shards_;
  std::size_t expert_shard_first_ = 0, expert_shard_last_ = 0;
  std::unique_ptr<AdamW> expert_optimizer_;
  /// Both bucket sets' first non-finite gradient offset (of the flat buffer), or -1.
  std::int64_t first_nonfinite_offset() const;
  /// Per-rank experts: the rank of the expert group that holds the routed-expert tensor
  /// named `name` ("...mlp.experts.<id>...."), or -1 for any other tensor (every slot
  /// holds it).
  int expert_owner(const std::string& name) const;
  std::size_t poison_offset_ = 0;  ///< where Faults::gradient_poison goes
  bool loss_scaling_ = false;      ///< training.precision fp16
  LossScaler scaler_;
  /// Device runs: host copies of parameters and moments (flat layout) for checkpoints;
  /// ZeRO: the moments gathered whole for a checkpoint (freed by the next step) and read
  /// whole on a restore (freed at its end): 8 bytes per parameter for that while (12 with
  /// a master shard: its parameters too).
  mutable std::vector<float> host_params_, host_m_, host_v_;
};

}  // namespace dst::train
