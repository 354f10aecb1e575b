#pragma once
/// \file grad_sync.hpp
/// How a rank's gradients become the data group's update: one implementation per
/// strategy behind one interface (docs/architecture.md, "one optimizer step, end to end").
///
///  - replicated: every rank holds the whole optimizer state; the gradients are
///    all-reduced in buckets over MPI, or over NCCL on the model's stream;
///  - shared: the data group's ranks share one node; gradients and parameters live in its
///    shared memory (comm::SharedSum), the sums are taken there, and each rank updates its
///    part of the flat buffers, gathered in place (with ZeRO the moments of that part only);
///  - zero: ZeRO stages 1 and 2 over MPI, the gradients reduce-scattered onto shards of
///    whole tensors, the shard updated, the parameters all-gathered (stage 2: the gradient
///    memory outside the shard given back to the system after its reduce-scatter).
///
/// Expert parallelism's storage (each rank holds its own routed experts, the last tensors
/// of its store) is a second region of the same mechanism: the replicated tensors
/// [0, offset) over the data group, the own experts [offset, end) over the expert-data
/// group, each with its buckets (and under ZeRO its shards and optimizer).
///
/// A strategy owns the memory it needs before the model exists (the shared buffers, the
/// pages of ZeRO stage 2), the buckets, shards and optimizers after attach(), the
/// gradient norm's local sums, the update, and the optimizer state a checkpoint saves and
/// restores (gathered whole where it is sharded or on a device).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "comm/process_groups.hpp"
#include "config/run_config.hpp"
#include "model/language_model.hpp"
#include "model/param_store.hpp"
#include "runtime/runtime.hpp"
#include "runtime/startup_watchdog.hpp"
#include "tensor/context.hpp"
#include "train/grad_buckets.hpp"
#include "train/grad_norm.hpp"
#include "train/optimizer.hpp"
#include "train/zero_shards.hpp"

namespace dst::train {

/// Where expert parallelism's own experts start in a store: they are its last tensors.
struct OwnExperts {
  std::size_t first_tensor = 0;  ///< the store's size when it holds none
  std::size_t offset = 0;        ///< flat-buffer offset of the first (the buffer's size: none)
};
/// The own experts of `store`: the tensors with ep_size > 1. Throws dst::Error when they
/// are not the last tensors of the store, or when there are none.
OwnExperts locate_own_experts(const model::ParamStore& store);
/// True when `store` ends in own experts (a tensor with ep_size > 1 last).
bool holds_own_experts(const model::ParamStore& store);

class GradSync {
 public:
  /// What a strategy is made from.
  struct Setup {
    const config::RunConfig* config = nullptr;
    comm::ProcessGroups* groups = nullptr;
    /// The back end the model runs on (its memory holds parameters, gradients, moments).
    tensor::ExecContext ctx;
    /// The resolved parallel.backend: mpi, nccl (a communicator of the data group on
    /// ctx.stream, made here) or shm (the data group's shared buffers, made here).
    runtime::CommBackend backend = runtime::CommBackend::mpi;
    /// Names the start-up steps that make the NCCL communicator or the shared buffers.
    runtime::StartupWatchdog* watchdog = nullptr;
    /// This rank's flat buffers' size (its stage's, slices' and experts' tensors).
    std::size_t elements = 0;
    /// Expert parallelism's storage: the store ends in this rank's own experts.
    bool own_experts = false;
  };
  /// ZeRO's shards of `store` as the strategies make them: the replicated tensors
  /// [0, own.offset) over `data_ranks` (shards of whole tensors; parts of the buffer where
  /// the ranks share the update, `shared`), and the own experts [own.offset, end) over
  /// `expert_data_ranks` (offsets relative to own.offset; none when the store holds no own
  /// experts). train::make_plan sizes a rank's state with the same shards.
  struct Shards {
    ZeroShards replicated;
    std::unique_ptr<ZeroShards> own_experts;
  };
  static Shards zero_shards(const model::ParamStore& store, const OwnExperts& own, int data_ranks,
                            int expert_data_ranks, bool shared);
  /// The bytes of a gradient bucket (parallel.bucket_mb); GradBuckets::layout cuts the
  /// buffers with it.
  static double bucket_bytes(const config::RunConfig& cfg);
  /// The strategy `setup` calls for, with its memory made (collective over the data
  /// group). Throws dst::Error for a combination not built (ZeRO on a device or over
  /// NCCL; own experts over shm or NCCL). With one data rank ZeRO does nothing (a warning
  /// from world rank 0; replicated).
  static std::unique_ptr<GradSync> make(const Setup& setup);
  virtual ~GradSync();
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  /// The memory the model's store lives in, made before the model: its gradients (shm;
  /// ZeRO stage 2's untouched pages) and its parameters (shm); null where the store
  /// allocates its own.
  float* grad_memory() const { return grad_memory_; }
  float* param_memory() const { return param_memory_; }
  /// ZeRO with bf16/fp16: the fp32 master parameters exist only as the optimizer's shard;
  /// the model's parameter buffer is the compute copy (LanguageModel's master_outside).
  bool master_shard() const { return master_shard_; }
  /// The ZeRO stage in effect (0 with one data rank).
  int zero_stage() const { return zero_stage_; }

  /// The buckets, shards and optimizers over the model's store (once, after the model).
  void attach(model::ParamStore& store);
  /// Expert parallelism's storage: where the own experts start (attach() set it).
  const OwnExperts& own_experts() const { return own_experts_; }

  // --- a step
  /// Before the step's backwards: the gradients zeroed, the buckets reset, a checkpoint's
  /// gathered copies freed.
  void begin_step();
  /// Backward's gradients at offsets >= `offset` are final (starts the buckets there).
  void ready(std::size_t offset) { buckets_->ready(offset); }
  /// Completes every sum (the own experts' start here); returns the seconds waited.
  double wait_all();
  /// The first offset of the flat buffer whose gradient was not finite before the sum
  /// (either region), or -1.
  std::int64_t first_nonfinite_offset() const;
  /// The squared gradient norm's local parts (GlobalNorm's inputs): every tensor's sum of
  /// squares (the summed gradient's; 0 for a tensor whose sums this rank does not hold, in
  /// `per_tensor`, one per tensor of the store) and the total over the data group's region
  /// (ZeRO with own experts: without them; GlobalNorm adds theirs from `per_tensor`).
  /// Collective over the data group where the work is shared or sharded, and over the
  /// expert-data group for ZeRO's own experts.
  virtual double norm_sums(GradNorm& norm, std::vector<double>& per_tensor) = 0;
  /// The ranges of the flat buffer that hold this rank's sums after wait_all() (ZeRO: its
  /// shards; else the whole buffer).
  virtual std::vector<std::pair<std::size_t, std::size_t>> summed_ranges() const;
  /// AdamW at `lr` with every gradient times `grad_scale` on what this rank updates, the
  /// parameters gathered where the update is shared or sharded, the model's compute copy
  /// refreshed. Returns the seconds of the parameters' gather (communication).
  double update(model::LanguageModel& model, double lr, double grad_scale);

  // --- the state
  /// After the store's initialize(): the master shard from its fp32 values, and the
  /// model's compute copy rounded.
  void initialize(model::LanguageModel& model);
  /// After the MoE correction biases moved in the parameter buffer (every rank alike):
  /// with a master shard, each element's owner takes the new value into it.
  void bias_moved(const model::LanguageModel& model, std::size_t experts);
  /// This rank's whole flat buffers of state (tensor i of the store at spec(i).offset of
  /// each), for a checkpoint. saved(): the state as it is (collective over the data group
  /// where it is sharded or shared: the other ranks' parts gathered; a device's copied
  /// down), valid until the next step; `params_only` (final-params.h5): the parameters
  /// alone, m and v null (every rank of the group alike). to_restore(): buffers to read a
  /// checkpoint into,
  /// which restored() then makes the state (each rank's parts kept; copied up to a device).
  struct State {
    float* params = nullptr;
    float* m = nullptr;
    float* v = nullptr;
  };
  State saved(bool params_only = false);
  State to_restore();
  void restored(std::int64_t optimizer_steps);
  /// Steps the optimizer has applied.
  std::int64_t optimizer_steps() const { return optimizer_->step_count(); }
  /// Bytes of this rank's AdamW moments (both regions' optimizers): what train::make_plan
  /// plans as MemoryPlan::optimizer for the heaviest rank.
  std::size_t moment_bytes() const {
    return optimizer_->bytes() + (expert_optimizer_ ? expert_optimizer_->bytes() : 0);
  }

 protected:
  GradSync(const Setup& setup, int zero_stage);
  /// The strategy's buckets (and ZeRO's shards and optimizers) over `store`.
  virtual void make_parts(model::ParamStore& store) = 0;
  /// The optimizers' step on what this rank updates, the parameters gathered where the
  /// update is shared or sharded (the compute copy of a master shard refreshed before the
  /// gather); returns the gather's seconds.
  virtual double apply(model::LanguageModel& model, double lr, double grad_scale) = 0;
  /// Stops and frees the buckets (their progress threads poll the strategy's
  /// communicator and memory): each strategy's destructor calls it before its own members
  /// go.
  void release_buckets();
  /// Zeroes the gradient buffer before the backwards (by writing it, unless the strategy
  /// returns its pages).
  virtual void zero_gradients();
  /// The moments are sharded: saved() gathers them, to_restore() reads them into host copies.
  bool sharded() const { return optimizer_->sharded(); }
  /// Every rank's shard of a flat buffer into `whole` (host memory, the buffer's size)
  /// from this rank's shard `mine` of optimizer_ and `mine_experts` of expert_optimizer_.
  void gather_shards(float* whole, const float* mine, const float* mine_experts) const;
  /// The optimizers' moments of the other ranks' parts, where the state is whole but the
  /// update shared (shm): gathered in place.
  virtual void gather_parts() {}

  const config::RunConfig& cfg_;
  comm::ProcessGroups& groups_;
  tensor::ExecContext ctx_;
  bool own_experts_wanted_ = false;
  int zero_stage_ = 0;
  bool master_shard_ = false;
  float* grad_memory_ = nullptr;
  float* param_memory_ = nullptr;
  model::ParamStore* store_ = nullptr;
  OwnExperts own_experts_;
  std::unique_ptr<GradBuckets> buckets_;         ///< [0, own_experts_.offset) or all
  std::unique_ptr<GradBuckets> expert_buckets_;  ///< the own experts, over expert-data
  std::unique_ptr<ZeroShards> shards_, expert_shards_;
  std::unique_ptr<AdamW> optimizer_;         ///< the whole buffer, or the data group's shard
  std::unique_ptr<AdamW> expert_optimizer_;  ///< ZeRO: the own experts' shard
  /// A device's state, or the sharded moments (and master), whole in host memory for a
  /// checkpoint: until the next step (saved()) or the end of restored().
  std::vector<float> host_params_, host_m_, host_v_;
};

}  // namespace dst::train
