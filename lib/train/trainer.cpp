#include "train/trainer.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <sstream>
#include <unordered_map>

#include <sys/mman.h>

#include "comm/nccl_bootstrap.hpp"
#include "comm/shared_sum.hpp"
#include "core/exit_codes.hpp"
#include "core/flight_recorder.hpp"
#include "core/log.hpp"
#include "core/step_context.hpp"
#include "model/layers/embedding.hpp"
#include "model/pipeline_schedule.hpp"
#include "runtime/signals.hpp"
#include "tensor/memory.hpp"
#include "train/schedule.hpp"

namespace dst::train {

namespace {

// The buffers of a shared-memory data group (Options::grad_comm shm, made by the constructor).
constexpr std::size_t kGradBuffer = 0;
constexpr std::size_t kParamBuffer = 1;
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// (rows, T + 1) samples -> inputs (rows, T) and targets shifted by one (rows, T). Padding
/// (model::kIgnoreIndex) stays in the targets, where the loss skips it, and becomes token 0
/// in the inputs (data::SampleStore).
void split_rows(const std::int32_t* rows, std::int64_t n, std::int64_t T, std::int32_t* tokens,
                std::int32_t* targets) {
  for (std::int64_t b = 0; b < n; ++b) {
    const std::int32_t* row = rows + b * (T + 1);
    for (std::int64_t t = 0; t < T; ++t) {
      const std::int32_t in = row[t];
      tokens[b * T + t] = in == model::kIgnoreIndex ? 0 : in;
      targets[b * T + t] = row[t + 1];
    }
  }
}

/// training.precision -> the storage type the model computes with (docs/precision.md).
DType storage_type(config::Precision precision) {
  switch (precision) {
    case config::Precision::fp32:
      return DType::f32;
    case config::Precision::bf16:
      return DType::bf16;
    case config::Precision::fp16:
      return DType::f16;
  }
  throw Error("trainer: training.precision holds no known value (" +
              std::to_string(static_cast<int>(precision)) + ")");
}

}  // namespace

/// The model as the pipeline executor's stage: a training step's micro-batches split from
/// the step's samples (each forward's MoE balance-loss terms given to the balancer), or an
/// evaluation batch the caller has split into tokens_ and targets_.
class Trainer::ModelStage final : public PipelineStage {
 public:
  explicit ModelStage(Trainer& t) : t_(t) {}
  /// Training: the step's samples (micro-batches, B, T + 1) and the backward's scale.
  const std::int32_t* rows = nullptr;
  float backward_scale = 1.0f;

  std::size_t record(int chunk, std::int64_t micro) const override {
    return t_.model_->record(chunk, micro);
  }
  tensor::Tensor input(std::size_t r) const override { return t_.model_->stage_input(r); }
  tensor::Tensor output(std::size_t r) const override { return t_.model_->stage_output(r); }
  tensor::Tensor gradient() const override { return t_.model_->stage_gradient(); }
  Forward forward(int chunk, std::int64_t micro, std::size_t r, bool with_gradient) override {
    model::DenseModel& model = *t_.model_;
    const std::int64_t B = t_.cfg_.training.micro_batch_size;
    const std::int64_t T = t_.cfg_.data.seq_len;
    if (with_gradient)
      split_rows(rows + static_cast<std::size_t>(micro * B * (T + 1)), B, T, t_.tokens_.data(),
                 t_.targets_.data());
    Forward f;
    f.loss_sum =
        model.stage_forward(r, t_.tokens_.data(), t_.targets_.data(),
                            with_gradient ? backward_scale : 1.0f, with_gradient, &f.valid);
    f.mtp_loss_sum = model.last_mtp_loss();
    f.seconds = model.last_forward_seconds();
    if (with_gradient && t_.balancer_->own_blocks() > 0)
      t_.balancer_->keep_terms(micro, chunk, model.last_aux_losses());
    return f;
  }
  double backward(std::size_t r, const std::function<void(std::size_t)>& on_ready) override {
    t_.model_->stage_backward(r, on_ready);
    return t_.model_->last_backward_seconds();
  }

 private:
  Trainer& t_;
};

Trainer::Trainer(const config::RunConfig& config, const config::Layout& layout,
                 comm::ProcessGroups& groups, data::SampleStore& train, Options options)
    : cfg_(config),
      layout_(layout),
      groups_(groups),
      ctx_(options.ctx),
      faults_(config.debug, groups.world->rank(), groups.world->size()) {
  const std::int64_t micro = config.training.micro_batch_size;
  const std::int64_t T = config.data.seq_len;
  const double bucket_bytes = config.parallel.bucket_mb * 1024.0 * 1024.0;
  // Pipeline stages: this rank holds its stage's layers only, with one activation record
  // per micro-batch 1F1B keeps in flight.
  stages_ = layout.pipeline;
  stage_ = groups.pipeline_rank;
  tensor_ = layout.tensor;
  const model::TensorSlice slice{groups.tensor_rank, tensor_, config.parallel.sequence_parallel};
  // Expert parallelism: this rank holds its expert slot's routed experts only (with
  // pipeline stages, on a stage holding an MoE block; one without has no experts). ZeRO
  // over MPI shards the two parts of the buffer apart (the replicated tensors over the
  // data group, the own experts over the expert-data group); ZeRO in shared memory (whose
  // parts are the node's) keeps every expert on every rank (the start-up,
  // runtime::resolve_backends, refuses shm with split experts; a Trainer built directly
  // may still get it). `any_expert_storage_`: some stage stores them (the
  // consistency check of the own experts is collective over the world).
  const bool storage_allowed =
      layout.expert > 1 &&
      (config.parallel.zero_stage == 0 || options.grad_comm == runtime::CommBackend::mpi);
  expert_storage_ = storage_allowed && model::own_expert_storage(config, groups.pipeline_rank);
  for (int s = 0; s < static_cast<int>(layout.pipeline); ++s)
    any_expert_storage_ =
        any_expert_storage_ || (storage_allowed && model::own_expert_storage(config, s));
  const model::ExpertSlice experts{expert_storage_ ? groups.expert_rank : 0,
                                   expert_storage_ ? layout.expert : 1};
  // Under the interleaved schedule the rank holds `chunks_` chunks of blocks, each with
  // the records its micro-batches in flight need (model::rank_chunks).
  std::vector<model::StageBlocks> chunks{model::StageBlocks::whole()};
  if (stages_ > 1) {
    if (tensor::device_of(ctx_) != tensor::Device::host)
      throw Error("trainer: parallel.pipeline " + std::to_string(stages_) +
                  " needs the model in host memory (stages send host buffers over MPI)");
    chunks_ = model::pipeline_chunks(config);
    chunks = model::rank_chunks(config, stage_, layout.grad_accum_steps);
    if (groups.world->rank() == 0) {
      std::ostringstream os;
      os << "pipeline: " << stages_ << " stages, "
         << (chunks_ > 1 ? "interleaved, " + std::to_string(chunks_) + " chunks per stage"
                         : std::string("1f1b"))
         << ", " << layout.grad_accum_steps << " micro-batches per step; bubble "
         << model::bubble_fraction(stages_, layout.grad_accum_steps, chunks_) << "; stage 0 holds";
      for (const model::StageBlocks& c : chunks)
        os << (&c == &chunks.front() ? " " : ", ") << "blocks [" << c.first << ", " << c.last
           << ") x " << c.slots << " records";
      log::info(os.str());
    }
  }
  if (tensor_ > 1 && tensor::device_of(ctx_) != tensor::Device::host)
    throw Error("trainer: parallel.tensor " + std::to_string(tensor_) +
                " needs the model in host memory (the tensor group reduces host buffers over "
                "MPI; not built for devices yet)");
  if (stages_ > 1 || tensor_ > 1 || expert_storage_) {
    // The whole model's layout and each stage's (whole tensors, not this rank's slices):
    // what a checkpoint holds.
    full_layout_ = std::make_unique<model::ParamStore>(model::dense_parameter_layout(config.model),
                                                       tensor::Arena::Mode::plan);
    for (int s = 0; s < stages_; ++s)
      stage_specs_.push_back(
          model::ParamStore(
              model::stage_parameter_layout(
                  config.model, stages_ > 1 ? model::rank_chunks(config, s, 0) : chunks),
              tensor::Arena::Mode::plan)
              .specs());
  }
  const std::size_t stage_elements = model::flat_buffer_elements(
      model::stage_parameter_layout(config.model, chunks, slice, experts));
  const auto step = [&](const char* what, double timeout_s) {
    return options.watchdog
               ? std::make_unique<runtime::StartupStep>(*options.watchdog, what, timeout_s)
               : nullptr;
  };
  if (options.grad_comm == runtime::CommBackend::nccl) {
    const auto s = step("NCCL communicator of the data group", 0.0);  // polled by NCCL's own
    device_comm_ = comm::make_device_communicator(*groups.data, "data", config.parallel.timeout_s,
                                                  config.parallel.init_timeout_s, ctx_.stream);
  } else if (options.grad_comm == runtime::CommBackend::shm) {
    // The gradients (buffer 0) and parameters (buffer 1), with a slot per bucket and one
    // for the parameters' gather.
    const auto s = step("shared-memory gradient and parameter buffers of the data group",
                        config.parallel.init_timeout_s);
    const std::size_t elements = stage_elements;
    shared_ = std::make_unique<comm::SharedSum>(
        *groups.data, elements, GradBuckets::bucket_count_for(elements, bucket_bytes) + 1, 2);
  }
  // ZeRO: one data rank has nothing to shard (the stage does nothing: say so). A device's
  // gradients and moments: the NCCL back end has the shard collectives, but the path here
  // (buckets onto shards, shard norm, checkpoint gathers, stage 2's pages) is host-only.
  zero_stage_ = static_cast<int>(config.parallel.zero_stage);
  if (zero_stage_ > 0 && groups.data->size() == 1) {
    if (groups.world->rank() == 0)
      log::warn("parallel.zero_stage " + std::to_string(zero_stage_) +
                " does nothing with one data rank: every rank holds the whole optimizer state "
                "(as zero_stage 0)");
    zero_stage_ = 0;
  }
  if (zero_stage_ > 0 && (tensor::device_of(ctx_) != tensor::Device::host || device_comm_))
    throw Error("trainer: parallel.zero_stage " + std::to_string(zero_stage_) +
                " needs the model in host memory and the mpi or shm back end (a device's "
                "reduce-scatter onto shards is not built yet); set parallel.zero_stage: 0");
  if (expert_storage_ && (shared_ || device_comm_))
    throw Error("trainer: parallel.expert " + std::to_string(layout.expert) +
                " holds each rank's own routed experts, summed over the expert-data group: "
                "not built with the shm and nccl back ends (set parallel.backend: mpi)");
  if (zero_stage_ == 2 && !shared_) {
    // Stage 2 over MPI: gradient memory of pages nobody has touched (an allocation of the
    // store's own is zero-filled by writing it, which would make it all resident): pages
    // take memory only when backward writes them, and GradBuckets returns them. Huge
    // pages where the system gives them (transparent huge pages on madvise): a fault per
    // 2 MiB instead of per 4 KiB when backward writes them again each step.
    constexpr std::size_t kHuge = std::size_t{2} << 20;
    const std::size_t bytes = stage_elements * sizeof(float);
    const std::size_t mapped = bytes + kHuge;
    void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      throw Error("trainer: cannot map " + std::to_string(mapped) +
                  " bytes of gradient memory (parallel.zero_stage 2)");
    auto* aligned =
        reinterpret_cast<void*>((reinterpret_cast<std::uintptr_t>(p) + kHuge - 1) / kHuge * kHuge);
    (void)::madvise(aligned, bytes, MADV_HUGEPAGE);  // advice: without it, 4 KiB pages
    grad_pages_ = std::shared_ptr<void>(aligned, [p, mapped](void*) { ::munmap(p, mapped); });
  }
  // ZeRO with bf16/fp16: the optimizer holds the master's shard, the model's parameter
  // buffer is the compute copy (no master elsewhere).
  master_shard_ = zero_stage_ > 0 && config.training.precision != config::Precision::fp32;
  model_ = std::make_unique<model::DenseModel>(
      config.model, micro, T, tensor::Arena::Mode::allocate, ctx_,
      storage_type(config.training.precision), config.debug.deterministic,
      shared_ ? shared_->local(kGradBuffer) : static_cast<float*>(grad_pages_.get()),
      shared_ ? shared_->local(kParamBuffer) : nullptr, config.training.recompute, master_shard_,
      chunks, slice, experts);
  // Tensor parallelism: every forward and backward reduces over the tensor group.
  if (tensor_ > 1) {
    // Replicated key/value heads: their holders' group must be the one the model needs.
    const std::int64_t kv = config.model.n_kv_heads;
    const int replicas = tensor_ > kv ? static_cast<int>(tensor_ / kv) : 1;
    if (replicas > 1 && (!groups.kv_replica || groups.kv_replica->size() != replicas))
      throw Error("trainer: the " + std::to_string(replicas) +
                  " tensor ranks sharing each key/value head have no process group "
                  "(layout.kv_replicas " +
                  std::to_string(layout_.kv_replicas) + ")");
    tensor_parallel_ =
        std::make_unique<model::TensorParallel>(*groups.tensor, groups.kv_replica.get());
    model_->set_tensor_parallel(tensor_parallel_.get());
  }
  if (stages_ > 1) {
    pipeline_ =
        std::make_unique<PipelineExecutor>(*groups.pipeline, layout, groups.world->rank(), chunks_);
    model_stage_ = std::make_unique<ModelStage>(*this);
  }
  // DeepSeekMoE blocks in the model, and on each stage (the balance loss and the loads are
  // gathered over the pipeline group: every stage takes part, with or without MoE blocks).
  balancer_ = std::make_unique<MoeBalancer>(config, layout, groups);
  if (static_cast<std::int64_t>(balancer_->own_blocks()) != model_->moe_blocks())
    throw Error("trainer: the MoE balancer counts " + std::to_string(balancer_->own_blocks()) +
                " MoE blocks on pipeline stage " + std::to_string(stage_) + ", the model " +
                std::to_string(model_->moe_blocks()));
  // Tied embeddings or the MTP module with stages: the table on stage 0, its copy on the
  // last, each first in its store (model::Transformer::holds_embedding_copy).
  embedding_copy_ = model::stages_share_embedding(config) && (stage_ == 0 || stage_ == stages_ - 1);
  if (embedding_copy_) {
    const auto& ps = model_->params();
    const model::ParamSpec& table = ps.spec(ps.index_of(model::kEmbeddingTableName));
    if (table.offset != 0)
      throw Error("trainer: pipeline stage " + std::to_string(stage_) +
                  " holds the embedding table at offset " + std::to_string(table.offset) +
                  ", not first in its store");
    embedding_elements_ = static_cast<std::size_t>(table.shape.numel());
  }
  // Expert parallelism: the MoE layers' routed experts split over the expert group.
  if (layout.expert > 1 && model_->moe_blocks() > 0) {
    experts_ = std::make_unique<model::ExpertParallel>(*groups.expert);
    model_->set_expert_parallel(experts_.get());
  }
  // Node-limited routing: the experts' nodes (debug.expert_nodes, or the expert group's hosts).
  if (config.model.moe.max_nodes_per_token > 0 && model_->moe_blocks() > 0)
    model_->set_expert_nodes(
        model::expert_nodes(model_->moe_experts(), config.debug.expert_nodes,
                            layout.expert > 1 ? groups.expert.get() : nullptr));
  // One rank alone has nothing to share: it updates its own parameters.
  if (shared_ && shared_->size() > 1) {
    shared_update_ = shared_.get();
    gather_slot_ = shared_->slots() - 1;
  }
  loss_scaling_ = config.training.precision == config::Precision::fp16;
  if (expert_storage_) locate_own_experts();
  if (zero_stage_ > 0) {
    // shm: the parts the ranks already update; MPI: whole tensors (exact norms). Per-rank
    // experts: the replicated tensors over the data group, the own experts apart (below).
    const auto& store = model_->params();
    const std::size_t replicated = expert_storage_ ? expert_offset_ : store.buffer_elements();
    shards_ = std::make_unique<ZeroShards>(
        shared_ ? ZeroShards::by_parts(store.buffer_elements(), groups.data->size())
                : ZeroShards::by_tensors(store, groups.data->size(), 0, replicated));
    shard_first_ = shards_->first(groups.data->rank());
    shard_last_ = shards_->last(groups.data->rank());
    optimizer_ = std::make_unique<AdamW>(config.training.optimizer, store, shard_first_,
                                         shard_last_, master_shard_);
    if (expert_storage_) {
      // The own experts' replicas are the expert-data group: their shards are its ranks'.
      expert_shards_ = std::make_unique<ZeroShards>(ZeroShards::by_tensors(
          store, groups.expert_data->size(), expert_offset_, store.buffer_elements()));
      expert_shard_first_ = expert_offset_ + expert_shards_->first(groups.expert_data->rank());
      expert_shard_last_ = expert_offset_ + expert_shards_->last(groups.expert_data->rank());
      expert_optimizer_ = std::make_unique<AdamW>(
          config.training.optimizer, store, expert_shard_first_, expert_shard_last_, master_shard_);
    }
  } else {
    optimizer_ = std::make_unique<AdamW>(config.training.optimizer, model_->params());
  }
  data::SamplerConfig sc;
  sc.num_samples = train.num_samples();
  sc.seed = config.run.seed;
  sc.global_batch_size = static_cast<std::uint64_t>(layout.global_batch_size);
  sc.micro_batch_size = static_cast<std::uint64_t>(micro);
  sc.dp_rank = groups.data_rank;
  sc.dp_size = layout.data;
  batches_ = std::make_unique<data::BatchSource>(train, sc, T);
  auto& ps = model_->params();
  if (shared_)
    buckets_ = std::make_unique<GradBuckets>(*shared_, bucket_bytes, config.parallel.overlap);
  else if (zero_stage_ > 0) {
    buckets_ = std::make_unique<GradBuckets>(*groups.data, ps.grads_data(), *shards_, bucket_bytes,
                                             config.parallel.overlap, zero_stage_ == 2);
    // Per-rank experts: reduce-scattered over the expert-data group, started by wait_all()
    // after the backward (as their all-reduce without ZeRO).
    if (expert_storage_)
      expert_buckets_ = std::make_unique<GradBuckets>(
          *groups.expert_data, ps.grads_data() + expert_offset_, *expert_shards_, bucket_bytes,
          config.parallel.overlap, zero_stage_ == 2);
  } else if (expert_storage_)
    make_expert_buckets(bucket_bytes);
  else
    buckets_ = std::make_unique<GradBuckets>(device_comm_ ? *device_comm_ : *groups.data,
                                             ps.grads_data(), ps.buffer_elements(), bucket_bytes,
                                             config.parallel.overlap, ctx_);
  // Faults::gradient_poison goes into the first gradient of the last block's MLP output
  // (an MoE block's: its first routed expert's); with stages, of this stage's last block.
  const std::int64_t last_block = model_->chunks().back().last - 1;
  // (Expert parallelism: this rank's first expert.)
  const std::string poisoned =
      config.model.moe_layer(last_block)
          ? ".mlp.experts." +
                std::to_string(experts.rank * (config.model.n_routed_experts / experts.size)) +
                ".down_proj.weight"
          : ".mlp.down_proj.weight";
  poison_offset_ =
      ps.spec(ps.index_of("model.layers." + std::to_string(last_block) + poisoned)).offset;
  GlobalNorm::Parts norm_parts;
  if (tensor_ > 1) {
    norm_parts.tensor = groups.tensor.get();
    norm_parts.tensor_rank = groups.tensor_rank;
  }
  if (expert_storage_) {
    norm_parts.expert = groups.expert.get();
    norm_parts.own_experts_from = expert_first_tensor_;
  }
  if (stages_ > 1) {
    norm_parts.pipeline = groups.pipeline.get();
    for (const auto& specs : stage_specs_)
      norm_parts.stage_sizes.push_back(specs.size());
    // Where each stage's tensors stand in the whole model (the interleaved schedule's
    // chunks leave them out of the model's order; the last stage's copy of the embedding
    // table is counted once, from stage 0).
    for (int s = 0; s < stages_; ++s)
      for (const model::ParamSpec& spec : stage_specs_[static_cast<std::size_t>(s)])
        norm_parts.model_index.push_back(is_embedding_copy(s, spec.name)
                                             ? GlobalNorm::kNone
                                             : full_layout_->index_of(spec.name));
    if (expert_storage_) {
      // Each own tensor's index in its stage's whole layout.
      std::unordered_map<std::string, std::size_t> at;
      const auto& specs = stage_specs_[static_cast<std::size_t>(stage_)];
      for (std::size_t i = 0; i < specs.size(); ++i)
        at[specs[i].name] = i;
      for (const model::ParamSpec& spec : model_->params().specs())
        norm_parts.stage_index.push_back(at.at(spec.name));
    }
  }
  global_norm_ = std::make_unique<GlobalNorm>(std::move(norm_parts));
  nonfinite_ = std::make_unique<NonFiniteNamer>(*groups.world, layout, logical_parameters());
  ConsistencyChecker::Replicas replicas;
  replicas.stage = stage_;
  replicas.whole = full_layout_.get();
  replicas.own_experts = expert_storage_;
  replicas.own_experts_from = expert_first_tensor_;
  replicas.any_stage_own_experts = any_expert_storage_;
  replicas.shared_embedding = model::stages_share_embedding(config);
  replicas.tied = config.model.tie_embeddings;
  consistency_ = std::make_unique<ConsistencyChecker>(groups, layout, replicas);
  batch_.resize(static_cast<std::size_t>(layout.grad_accum_steps * micro * (T + 1)));
  tokens_.resize(static_cast<std::size_t>(micro * T));
  targets_.resize(tokens_.size());
}

Trainer::~Trainer() = default;

void Trainer::gather_state(float* data) const {
  comm::SharedSum& shared = *shared_update_;
  const std::size_t n = shared.elements();
  std::size_t first = 0, last = 0;
  comm::SharedSum::part_of(n, shared.size(), shared.rank(), first, last);
  float* through = shared.local(kGradBuffer);
  std::memcpy(through + first, data + first, (last - first) * sizeof(float));
  shared.igather(gather_slot_, 0, n, kGradBuffer).wait();
  // The peers' parts: everything before and after this rank's (parts are in rank order).
  std::memcpy(data, through, first * sizeof(float));
  std::memcpy(data + last, through + last, (n - last) * sizeof(float));
}

double Trainer::gather_parameters() {
  const auto t0 = Clock::now();
  float* params = model_->params().params_data();
  std::vector<comm::Request> requests;
  // The buckets of a part of the buffer over its group (per-rank experts: the own
  // experts' part over the expert-data group, from expert_offset_).
  const auto gather = [&](const GradBuckets& b, comm::Communicator& group, const ZeroShards& shards,
                          float* base) {
    for (std::size_t i = 0; i < b.bucket_count(); ++i)
      requests.push_back(group.iallgather_blocks(
          base + b.bucket_begin(i), shards.counts(b.bucket_begin(i), b.bucket_end(i)), DType::f32));
  };
  gather(*buckets_, *groups_.data, *shards_, params);
  if (expert_shards_)
    gather(*expert_buckets_, *groups_.expert_data, *expert_shards_, params + expert_offset_);
  for (auto& r : requests)
    r.wait();
  return since(t0);
}

void Trainer::initialize_parameters() {
  auto& ps = model_->params();
  ps.initialize(cfg_.run.seed);
  if (master_shard_) {
    // The master's shard from the fp32 values, then the buffer rounded in place.
    for (const AdamW* o : {optimizer_.get(), expert_optimizer_.get()}) {
      if (!o) continue;
      const AdamWState st = o->state();
      tensor::copy(ctx_, st.master, ps.params_data() + st.first, st.elements * sizeof(float));
    }
  }
  model_->refresh_compute_params();
}

void Trainer::gather_master(float* whole) const {
  gather_shards(whole, optimizer_->state().master,
                expert_optimizer_ ? expert_optimizer_->state().master : nullptr);
}

void Trainer::gather_shards(float* whole, const float* mine, const float* mine_experts) const {
  const AdamWState st = optimizer_->state();
  std::copy(mine, mine + st.elements, whole + st.first);
  groups_.data->iallgather_blocks(whole, shards_->sizes(), DType::f32).wait();
  if (!expert_optimizer_) return;
  const AdamWState ex = expert_optimizer_->state();
  std::copy(mine_experts, mine_experts + ex.elements, whole + ex.first);
  groups_.expert_data
      ->iallgather_blocks(whole + expert_offset_, expert_shards_->sizes(), DType::f32)
      .wait();
}

StepStats Trainer::step() {
  core::set_current_step(step_ + 1);  // as the log counts: from 1
  StepStats st;
  st.step = step_;
  const auto t_step = Clock::now();
  if (optimizer_->sharded()) {
    // ZeRO: the moments gathered whole for the last checkpoint are no longer viewed.
    std::vector<float>().swap(host_m_);
    std::vector<float>().swap(host_v_);
    if (master_shard_) std::vector<float>().swap(host_params_);
  }

  // --- data: this rank's micro-batches of the step's global batch
  auto t0 = Clock::now();
  batches_->next_step(batch_.data());  // (accum, micro, T + 1)
  faults_.straggle();
  st.t_data = since(t0);
  samples_seen_ += static_cast<std::uint64_t>(layout_.global_batch_size);
  const double mtp_tokens = weigh_mtp_loss();

  // --- forward + backward, gradients summed locally; buckets start on the last one
  // fp16 (docs/precision.md): the backward differentiates loss_scale x the mean loss of a
  // full micro-batch (what a GPU framework backpropagates, times the scale), so the fp16
  // activation gradients have their real magnitude; the optimizer's gradient scale undoes
  // it. fp32 and bf16: the gradient of the loss sum, unscaled (a scale of exactly 1).
  const float backward_scale =
      loss_scaling_ ? static_cast<float>(
                          scaler_.scale() /
                          static_cast<double>(cfg_.training.micro_batch_size * cfg_.data.seq_len))
                    : 1.0f;
  st.loss_scale = loss_scaling_ ? scaler_.scale() : 0.0;
  const Passes passes = forward_backward(backward_scale, st);

  // --- the global loss, tokens and flags
  const Sums sums = sum_over_ranks(passes, mtp_tokens, st);
  // Gradients of the mean: 1 / tokens; under fp16 also 1 / backward_scale (the unscale).
  const double scale =
      st.tokens > 0 ? (loss_scaling_ ? 1.0 / sums.tokens / backward_scale : 1.0 / sums.tokens)
                    : 0.0;

  // --- norm, non-finite policy, clipping, optimizer
  t0 = Clock::now();
  double gathered_s = 0.0;  // ZeRO over MPI: the parameters' all-gather
  st.grad_norm = std::sqrt(gradient_norm_squared()) * scale;
  st.lr = learning_rate(cfg_.training, step_, layout_.world_size);
  // Non-finite: some rank's own gradient had a NaN/inf before the all-reduce (the
  // per-rank 0/1 flags summed: > 0 exactly when their MAX is 1), or the sum overflowed
  // (the norm, identical on every rank). Every rank decides alike.
  const bool nonfinite = !std::isfinite(st.grad_norm) || sums.nonfinite_ranks > 0.0;
  if (nonfinite && loss_scaling_)
    skip_overflow(st, sums.nonfinite_ranks);
  else if (nonfinite)
    skip_nonfinite(st);  // or throw (debug.nan_policy: abort)
  else
    gathered_s = update(st, scale);
  if (balancer_->active()) balance_moe(st, passes.aux_sum);
  st.t_optimizer = since(t0) - gathered_s;
  st.t_comm += gathered_s;
  if (faults_.diverges_after(step_)) diverge();  // the consistency check must see it
  ++step_;
  st.seconds = since(t_step);
  return st;
}

double Trainer::weigh_mtp_loss() {
  // Multi-token prediction: the objective is the main mean + mtp_loss_weight x the MTP
  // mean over the global batch; the model's gradients are of loss sums, scaled by
  // 1 / (main target tokens), so each MTP token weighs mtp_loss_weight x main tokens / MTP
  // tokens (global counts: one all-reduce of two doubles, exact integers).
  if (!model_->has_mtp()) return 0.0;
  const std::int64_t T = cfg_.data.seq_len;
  const std::size_t sample_len = static_cast<std::size_t>(T + 1);
  double counts[2] = {0.0, 0.0};  // main targets s[t+1], MTP targets s[t+2] (t < T - 1)
  for (std::size_t r = 0; r < batch_.size() / sample_len; ++r) {
    const std::int32_t* row = batch_.data() + r * sample_len;
    for (std::int64_t t = 1; t <= T; ++t) {
      if (row[t] == model::kIgnoreIndex) continue;
      counts[0] += 1.0;
      if (t >= 2) counts[1] += 1.0;
    }
  }
  groups_.data->allreduce(counts, 2, DType::f64, comm::ReduceOp::sum);
  model_->set_mtp_loss_scale(counts[1] > 0.0 ? cfg_.model.mtp_loss_weight * counts[0] / counts[1]
                                             : 0.0);
  return counts[1];
}

Trainer::Passes Trainer::forward_backward(float backward_scale, StepStats& st) {
  const std::int64_t micro = cfg_.training.micro_batch_size;
  const std::int64_t T = cfg_.data.seq_len;
  const std::size_t sample_len = static_cast<std::size_t>(T + 1);
  auto& ps = model_->params();
  // ZeRO stage 2 over MPI: zeroed by returning the buffer's pages (resident again only
  // while backward writes them and their bucket is in flight).
  if (zero_over_mpi() && zero_stage_ == 2) {
    buckets_->clear();
    if (expert_buckets_) expert_buckets_->clear();
  } else
    ps.zero_grads();
  GradBuckets& buckets = *buckets_;
  buckets.reset();
  if (expert_buckets_) expert_buckets_->reset();
  const std::optional<float> poison = faults_.gradient_poison(step_);
  bool injected = false;
  auto on_ready = [&](std::size_t offset) {
    if (poison && !injected && offset <= poison_offset_) {
      tensor::copy(ctx_, ps.grads_data() + poison_offset_, &*poison, sizeof(float));
      injected = true;
    }
    buckets.ready(offset);
  };
  Passes passes;
  const std::size_t micro_batches = static_cast<std::size_t>(layout_.grad_accum_steps);
  if (experts_) experts_->reset_traffic();
  if (tensor_parallel_) tensor_parallel_->reset_traffic();
  if (stages_ > 1) {
    // The embedding table's gradient (offset 0 on both ends) is the two ends' sum: its
    // buckets wait for the sum of the copies after the last backward.
    const auto held = [&](std::size_t offset) { on_ready(std::max(offset, embedding_elements_)); };
    balancer_->begin_step(layout_.grad_accum_steps);
    model_stage_->rows = batch_.data();
    model_stage_->backward_scale = backward_scale;
    const PipelineExecutor::Totals done = pipeline_->train(
        *model_stage_, embedding_copy_ ? std::function<void(std::size_t)>(held)
                                       : std::function<void(std::size_t)>(on_ready));
    passes.loss_sum = done.loss_sum;
    passes.valid = done.valid;
    passes.mtp_sum = done.mtp_loss_sum;
    st.t_forward += done.forward_s;
    st.t_backward += done.backward_s;
    st.t_comm += done.comm_s;
    if (embedding_copy_) {
      st.t_comm += pipeline_->sum_embedding_copies(ps.grads_data(), embedding_elements_);
      on_ready(0);
    }
  }
  for (std::size_t m = 0; stages_ == 1 && m < micro_batches; ++m) {
    const std::int32_t* mb = batch_.data() + m * static_cast<std::size_t>(micro) * sample_len;
    split_rows(mb, micro, T, tokens_.data(), targets_.data());
    std::int64_t v = 0;
    const bool last = m + 1 == micro_batches;
    core::FlightScope scope("forward+backward of micro-batch " + std::to_string(m + 1) + "/" +
                            std::to_string(micro_batches));
    passes.loss_sum += model_->forward_backward(
        tokens_.data(), targets_.data(), backward_scale, &v,
        last ? std::function<void(std::size_t)>(on_ready) : std::function<void(std::size_t)>());
    passes.valid += v;
    passes.aux_sum += model_->last_aux_loss();
    passes.mtp_sum += model_->last_mtp_loss();
    st.t_forward += model_->last_forward_seconds();
    st.t_backward += model_->last_backward_seconds();
  }
  const double p2p_s = st.t_comm;  // the pipeline's exposed sends and receives
  st.t_comm = buckets.wait_all() + p2p_s;
  // Expert parallelism: the own experts' gradients over the expert-data group (started here).
  if (expert_buckets_) st.t_comm += expert_buckets_->wait_all();
  if (tensor_parallel_) {
    st.t_tensor = tensor_parallel_->traffic().seconds;
    st.tensor_bytes = static_cast<double>(tensor_parallel_->traffic().bytes);
  }
  if (experts_) {
    const model::ExpertTraffic& tr = experts_->traffic();
    st.t_alltoall = tr.seconds;
    st.alltoall_bytes = static_cast<double>(tr.bytes_sent + tr.bytes_received);
    double rows[2] = {static_cast<double>(tr.rows_received), static_cast<double>(tr.rows_received)};
    groups_.data->allreduce(&rows[0], 1, DType::f64, comm::ReduceOp::max);
    groups_.data->allreduce(&rows[1], 1, DType::f64, comm::ReduceOp::sum);
    st.expert_rows_max = rows[0];
    st.expert_rows_mean = rows[1] / static_cast<double>(layout_.data);
  }
  return passes;
}

Trainer::Sums Trainer::sum_over_ranks(const Passes& passes, double mtp_tokens, StepStats& st) {
  // The global loss: mean over every target token of every rank (one all-reduce)
  // ... and, in the same all-reduce, how many ranks had a non-finite gradient of their own
  // and how many were asked to stop (a signal); with an MTP module, its loss sum too.
  enum Sum : std::size_t { kLoss, kTokens, kNonfinite, kStop, kMtpLoss, kSums };
  std::array<double, kSums> sums{};
  sums[kLoss] = passes.loss_sum;
  sums[kTokens] = static_cast<double>(passes.valid);
  sums[kNonfinite] = first_nonfinite_offset() >= 0 ? 1.0 : 0.0;
  sums[kStop] = runtime::stop_signal() != 0 ? 1.0 : 0.0;
  sums[kMtpLoss] = passes.mtp_sum;
  const std::size_t reduced = model_->has_mtp() ? kSums : kMtpLoss;
  groups_.data->allreduce(sums.data(), reduced, DType::f64, comm::ReduceOp::sum);
  // Stages: the losses are the last stage's (the others add +0, exact), the flags everyone's.
  if (stages_ > 1)
    groups_.pipeline->allreduce(sums.data(), reduced, DType::f64, comm::ReduceOp::sum);
  // Tensor slices: the loss is the same on each (the cross-entropy is over the group), the
  // flags are each rank's own (a slice's gradient may overflow alone).
  static_assert(kStop == kNonfinite + 1, "the tensor group sums the two flags in one call");
  if (tensor_ > 1)
    groups_.tensor->allreduce(sums.data() + kNonfinite, 2, DType::f64, comm::ReduceOp::sum);
  st.mtp = model_->has_mtp();
  st.mtp_loss = mtp_tokens > 0.0 ? sums[kMtpLoss] / mtp_tokens : 0.0;
  st.stop_ranks = static_cast<int>(sums[kStop]);
  st.tokens = static_cast<std::int64_t>(sums[kTokens]);
  st.loss = st.tokens > 0 ? sums[kLoss] / sums[kTokens] : 0.0;
  return Sums{sums[kTokens], sums[kNonfinite]};
}

double Trainer::gradient_norm_squared() {
  auto& ps = model_->params();
  const bool zero_mpi = zero_over_mpi();
  // The gradients are replicated: the ranks sharing the update share the norm too. ZeRO
  // over MPI: each rank holds the sums of its shard's tensors only.
  const double sum_of_squares =
      shared_update_ ? norm_.compute_shared(ctx_, ps, *groups_.data)
      : zero_mpi     ? norm_.compute_sharded(ctx_, ps, shard_first_, shard_last_, *groups_.data)
                     : norm_.compute(ctx_, ps);
  std::vector<double> per_tensor = norm_.per_tensor();
  if (zero_mpi && expert_storage_) {
    // The own experts' sums are the expert-data group's shards' (the call above summed
    // the data group's shards of the replicated tensors, the experts' entries +0).
    norm_.compute_sharded(ctx_, ps, expert_shard_first_, expert_shard_last_, *groups_.expert_data);
    const std::vector<double>& own = norm_.per_tensor();
    std::copy(own.begin() + static_cast<std::ptrdiff_t>(expert_first_tensor_), own.end(),
              per_tensor.begin() + static_cast<std::ptrdiff_t>(expert_first_tensor_));
  }
  return global_norm_->sum_of_squares(ps, std::move(per_tensor), sum_of_squares);
}

void Trainer::skip_overflow(StepStats& st, double nonfinite_ranks) {
  // fp16 overflow: the normal event that tunes the loss scale, not a divergence (no
  // nan_policy). Skip the step: parameters, moments and the optimizer's step count stay
  // untouched; halve the scale.
  st.skipped = true;
  st.overflow = true;
  ++skipped_;
  const double before = scaler_.scale();
  scaler_.update(true);
  std::ostringstream os;
  os << "fp16 gradient overflow at step " << step_ + 1 << " (" << static_cast<int>(nonfinite_ranks)
     << " of " << layout_.data << " data ranks had a non-finite gradient): step skipped, loss "
     << "scale " << before << " -> " << scaler_.scale();
  if (groups_.world->rank() == 0) log::warn(os.str());
}

void Trainer::skip_nonfinite(StepStats& st) {
  const auto& ps = model_->params();
  // The sums this rank holds: ZeRO over MPI its shards (of the replicated tensors and of
  // its own experts), else the whole buffer.
  std::vector<std::pair<std::size_t, std::size_t>> summed;
  if (zero_over_mpi()) {
    summed.emplace_back(shard_first_, shard_last_);
    if (expert_optimizer_) summed.emplace_back(expert_shard_first_, expert_shard_last_);
  } else {
    summed.emplace_back(0, ps.buffer_elements());
  }
  std::ostringstream os;
  os << "non-finite gradients at step " << step_ << ": "
     << nonfinite_->name(ps, ctx_, first_nonfinite_offset(), summed);
  if (cfg_.debug.nan_policy == config::NanPolicy::abort)
    throw CollectiveError(os.str() + " (debug.nan_policy: abort)", kExitDiverged);
  st.skipped = true;  // every rank decides alike: parameters and moments stay untouched
  ++skipped_;
}

double Trainer::update(StepStats& st, double scale) {
  auto& ps = model_->params();
  double gathered_s = 0.0;
  const double factor = clip_factor(st.grad_norm, cfg_.training.grad_clip);
  if (shared_update_) {
    // This rank's part of the update, then every rank's part into every rank's
    // parameters (the moments stay in parts: gather_state() for a checkpoint).
    std::size_t first = 0, last = 0;
    comm::SharedSum::part_of(ps.buffer_elements(), shared_update_->size(), shared_update_->rank(),
                             first, last);
    optimizer_->step(ctx_, ps, st.lr, scale * factor, first, last);
    // A master shard: the rounded copy of the shard is what the ranks gather.
    if (master_shard_) model_->refresh_compute_params(optimizer_->state().master, first, last);
    shared_update_->igather(gather_slot_, 0, ps.buffer_elements(), kParamBuffer).wait();
  } else if (zero_over_mpi()) {
    // The shard's update, then every shard into every rank's parameters: communication
    // (the phase's t_comm), not the optimizer's time. A master shard: the rounded copy
    // of the shard is what the ranks gather.
    optimizer_->step(ctx_, ps, st.lr, scale * factor, shard_first_, shard_last_);
    if (master_shard_)
      model_->refresh_compute_params(optimizer_->state().master, shard_first_, shard_last_);
    if (expert_optimizer_) {
      expert_optimizer_->step(ctx_, ps, st.lr, scale * factor, expert_shard_first_,
                              expert_shard_last_);
      if (master_shard_)
        model_->refresh_compute_params(expert_optimizer_->state().master, expert_shard_first_,
                                       expert_shard_last_);
    }
    gathered_s = gather_parameters();
  } else {
    optimizer_->step(ctx_, ps, st.lr, scale * factor);
  }
  // The rounded copy of the new master parameters (a master shard: gathered above).
  if (!master_shard_) model_->refresh_compute_params();
  tensor::synchronize(ctx_);  // the optimizer's phase ends when a device has run it
  if (loss_scaling_ && scaler_.update(false) && groups_.world->rank() == 0) {
    std::ostringstream os;
    os << "loss scale " << scaler_.scale() / LossScaler::kGrowthFactor << " -> " << scaler_.scale()
       << " after " << LossScaler::kGrowthInterval << " clean steps";
    log::info(os.str());
  }
  return gathered_s;
}

void Trainer::diverge() {
  const auto& ps = model_->params();
  // The first parameter; with tensor slices, the first tensor they all hold whole (a
  // norm), which the check compares across the slices.
  std::size_t at = 0;
  for (std::size_t i = 0; tensor_ > 1 && i < ps.size(); ++i)
    if (ps.spec(i).split == model::Split::replicated) {
      at = ps.spec(i).offset;
      break;
    }
  float first = 0.0f;
  tensor::copy(ctx_, &first, ps.params_data() + at, sizeof first);
  first += 1e-3f;
  tensor::copy(ctx_, ps.params_data() + at, &first, sizeof first);
}

bool Trainer::is_embedding_copy(int s, const std::string& name) const {
  return s > 0 && s == stages_ - 1 && model::stages_share_embedding(cfg_) &&
         name == model::kEmbeddingTableName;
}

void Trainer::arm_alltoallv_hang() {
  if (!experts_)
    throw Error(
        "trainer: debug.inject_hang_alltoallv_rank needs parallel.expert > 1 and an MoE "
        "model (there is no expert all-to-all to hang in)");
  experts_->hang_before_next_rows();
}

void Trainer::move_moe_bias(const std::vector<double>& loads) {
  model_->update_moe_bias(loads, cfg_.model.moe.bias_update_rate);
  if (!master_shard_) return;
  // The buffer keeps the biases in fp32 (the router's), moved alike on every rank: the
  // owner of each element in its master shard takes the new value.
  const AdamWState st = optimizer_->state();
  const std::size_t E = static_cast<std::size_t>(cfg_.model.n_routed_experts);
  const float* params = model_->params().params_data();
  for (const std::size_t at : model_->moe_bias_offsets())
    for (std::size_t o = at; o < at + E; ++o)
      if (o >= st.first && o < st.first + st.elements) st.master[o - st.first] = params[o];
}

void Trainer::balance_moe(StepStats& st, double aux_sum) {
  const MoeBalancer::Sums sums =
      balancer_->reduce(model_->moe_loads(), model_->moe_dropped(), aux_sum);
  model_->reset_moe_loads();
  // The bias follows the optimizer: a skipped step moves nothing.
  if (!st.skipped) move_moe_bias(sums.loads);
  balancer_->report(sums, model_->moe_bias(), st, step_);
}

std::pair<double, std::int64_t> Trainer::evaluate(data::SampleStore& store, std::int64_t batches) {
  const std::int64_t micro = cfg_.training.micro_batch_size;
  const std::int64_t T = cfg_.data.seq_len;
  const std::uint64_t n = store.num_samples();
  std::vector<std::int32_t> buf(static_cast<std::size_t>(micro * (T + 1)));
  double sums[2] = {0.0, 0.0};
  for (std::int64_t b = 0; b < batches && n > 0; ++b) {
    std::vector<std::uint64_t> ids;
    for (std::int64_t i = 0; i < micro; ++i)
      ids.push_back(static_cast<std::uint64_t>((b * layout_.data + groups_.data_rank) * micro + i) %
                    n);
    store.read(ids, buf.data());
    split_rows(buf.data(), micro, T, tokens_.data(), targets_.data());
    std::int64_t v = 0;
    if (stages_ > 1) {
      model_stage_->rows = nullptr;
      sums[0] += pipeline_->evaluate(*model_stage_, b, v);
    } else {
      sums[0] += model_->forward(tokens_.data(), targets_.data(), &v);
    }
    sums[1] += static_cast<double>(v);
  }
  groups_.data->allreduce(sums, 2, DType::f64, comm::ReduceOp::sum);
  if (stages_ > 1) groups_.pipeline->allreduce(sums, 2, DType::f64, comm::ReduceOp::sum);
  model_->reset_moe_loads();  // balancing counts the training batches' routing only
  return {sums[1] > 0 ? sums[0] / sums[1] : 0.0, static_cast<std::int64_t>(sums[1])};
}

std::vector<ckpt::TensorRef> Trainer::whole_model_tensors(bool params_only,
                                                          std::vector<int>& owner) const {
  std::vector<ckpt::TensorRef> out;
  owner.clear();
  const char* const prefixes[3] = {"params/", "optimizer/exp_avg/", "optimizer/exp_avg_sq/"};
  for (std::size_t part = 0; part < (params_only ? 1u : 3u); ++part)
    for (int s = 0; s < stages_; ++s)
      for (const model::ParamSpec& spec : stage_specs_[static_cast<std::size_t>(s)]) {
        if (is_embedding_copy(s, spec.name)) continue;  // stage 0's table
        out.push_back({prefixes[part] + spec.name,
                       std::vector<std::int64_t>(spec.shape.dims.begin(),
                                                 spec.shape.dims.begin() + spec.shape.rank),
                       nullptr});
        owner.push_back(s);
      }
  return out;
}

std::unordered_map<std::string, std::size_t> Trainer::index_by_name(
    const std::vector<ckpt::TensorRef>& tensors) {
  std::unordered_map<std::string, std::size_t> index;
  for (std::size_t k = 0; k < tensors.size(); ++k)
    index[tensors[k].name] = k;
  return index;
}

Trainer::CheckpointStream Trainer::checkpoint_stream(const bool params_only) const {
  // This rank's own tensors (ZeRO's moments gathered whole over the data group, a
  // device's copied down): params, then first moments, then second, in its store's order.
  auto own = std::make_shared<const std::vector<ckpt::TensorRef>>(state_tensors(true));
  const auto is_param = [](const std::string& name) { return name.rfind("params/", 0) == 0; };
  CheckpointStream out;
  if (stages_ == 1 && tensor_ == 1 && !expert_storage_) {
    for (const ckpt::TensorRef& t : *own)
      if (!params_only || is_param(t.name)) out.tensors.push_back({t.name, t.shape, nullptr});
    out.source = [own](std::size_t i) { return (*own)[i].data; };
    return out;
  }
  std::vector<int> owner;
  out.tensors = whole_model_tensors(params_only, owner);
  auto index =
      std::make_shared<const std::unordered_map<std::string, std::size_t>>(index_by_name(*own));
  auto whole = std::make_shared<std::vector<float>>();
  auto slices = std::make_shared<std::vector<float>>();
  const std::vector<ckpt::TensorRef> names = out.tensors;
  out.source = [this, own, index, owner, names, whole, slices](std::size_t i) -> const float* {
    std::size_t n = 1;
    for (const std::int64_t d : names[i].shape)
      n *= static_cast<std::size_t>(d);
    whole->resize(n);
    const int s = owner[i];
    // Per-rank experts: a routed expert's tensor comes from the rank that holds it.
    const int expert = expert_owner(names[i].name);
    if (s == stage_ && (expert < 0 || expert == groups_.expert_rank)) {
      // This stage's tensor: this rank's slice, and with slices every slice put in place.
      const std::size_t k = index->at(names[i].name);
      const auto& ps = model_->params();
      const model::ParamSpec& spec = ps.spec(k % ps.size());
      const auto local = static_cast<std::size_t>(spec.shape.numel());
      const float* mine = (*own)[k].data;
      if (tensor_ == 1 || spec.split == model::Split::replicated) {
        std::copy(mine, mine + local, whole->data());
      } else {
        slices->resize(local * static_cast<std::size_t>(tensor_));
        groups_.tensor->allgather(mine, slices->data(), local, DType::f32);
        // A slice shared by tp_replicas ranks: from the first of them.
        for (int r = 0; r < tensor_; r += spec.tp_replicas) {
          model::ParamSpec slice = spec;
          slice.tp_rank = r / spec.tp_replicas;
          model::copy_slice_to_whole(slice, slices->data() + static_cast<std::size_t>(r) * local,
                                     whole->data());
        }
      }
    }
    if (expert >= 0) groups_.expert->broadcast(whole->data(), n, DType::f32, expert);
    // From the stage that holds it to every stage (its rank in the pipeline group is s).
    if (stages_ > 1) groups_.pipeline->broadcast(whole->data(), n, DType::f32, s);
    return whole->data();
  };
  return out;
}

std::vector<ckpt::TensorRef> Trainer::state_tensors(const bool copy_from_device) const {
  const auto& ps = model_->params();
  const bool sharded = optimizer_->sharded();
  if (copy_from_device && shared_update_ && !sharded) {
    gather_state(optimizer_->state().m);
    gather_state(optimizer_->state().v);
  }
  std::vector<ckpt::TensorRef> out;
  out.reserve(3 * ps.size());
  // Host memory: views of the buffers themselves. A device: of host copies taken now.
  const bool on_host = tensor::device_of(ctx_) == tensor::Device::host;
  if (sharded) {
    // ZeRO (host memory): the moments of every shard, gathered whole (a save) or read
    // whole into these buffers (a restore, which keeps its own shard of them).
    const std::size_t n = ps.buffer_elements();
    const AdamWState st = optimizer_->state();
    const AdamWState ex = expert_optimizer_ ? expert_optimizer_->state() : AdamWState{};
    for (auto* h : {&host_m_, &host_v_}) {
      h->resize(n);
      if (!copy_from_device) continue;
      const bool first = h == &host_m_;
      gather_shards(h->data(), first ? st.m : st.v, first ? ex.m : ex.v);
    }
    // A master shard: the parameters too (the model's buffer holds the rounded copy).
    if (master_shard_) {
      host_params_.resize(n);
      if (copy_from_device) gather_master(host_params_.data());
    }
  } else if (!on_host) {
    const std::size_t n = ps.buffer_elements();
    const std::size_t bytes = n * sizeof(float);
    for (auto* h : {&host_params_, &host_m_, &host_v_})
      h->resize(n);
    if (copy_from_device) {
      tensor::copy(ctx_, host_params_.data(), ps.params_data(), bytes);
      tensor::copy(ctx_, host_m_.data(), optimizer_->state().m, bytes);
      tensor::copy(ctx_, host_v_.data(), optimizer_->state().v, bytes);
    }
  }
  const auto add = [&](const std::string& prefix, const tensor::Tensor& t, std::size_t i) {
    const tensor::Shape& sh = ps.spec(i).shape;
    std::vector<std::int64_t> shape(sh.dims.begin(), sh.dims.begin() + sh.rank);
    const bool moment = prefix != "params/";
    const bool gathered = sharded && (moment || master_shard_);  // whole in a host copy
    float* data = gathered ? nullptr : t.ptr<float>();
    if (!on_host || gathered) {
      // The same offset into the host copy of the same flat buffer.
      const std::vector<float>& h = prefix == "params/"              ? host_params_
                                    : prefix == "optimizer/exp_avg/" ? host_m_
                                                                     : host_v_;
      data = const_cast<float*>(h.data()) + ps.spec(i).offset;
    }
    out.push_back({prefix + ps.spec(i).name, std::move(shape), data});
  };
  for (std::size_t i = 0; i < ps.size(); ++i)
    add("params/", ps.param(i), i);
  // Sharded moments have no view per tensor: add() takes them from the whole host copy.
  for (std::size_t i = 0; i < ps.size(); ++i)
    add("optimizer/exp_avg/", sharded ? tensor::Tensor{} : optimizer_->m(i), i);
  for (std::size_t i = 0; i < ps.size(); ++i)
    add("optimizer/exp_avg_sq/", sharded ? tensor::Tensor{} : optimizer_->v(i), i);
  return out;
}

ckpt::Metadata Trainer::checkpoint_metadata() const {
  ckpt::Metadata m;
  m.step = step_;
  m.epoch = sampler().position().epoch;
  m.consumed = sampler().position().consumed;
  m.samples_seen = samples_seen_;
  m.optimizer_steps = optimizer_->step_count();
  m.skipped_steps = skipped_;
  m.loss_scale = loss_scaling_ ? scaler_.scale() : 1.0;  // 1: no loss scaling
  m.loss_scale_clean_steps = loss_scaling_ ? scaler_.clean_steps() : 0;
  m.seed = cfg_.run.seed;
  m.rng =
      "philox4x32-10, counter-based: every random number is a pure function of (run.seed, "
      "stream, counter); no generator state beyond the seed";
  m.world_size = layout_.world_size;
  m.data_parallel = layout_.data;
  m.tensor_parallel = layout_.tensor;
  m.pipeline_parallel = layout_.pipeline;
  m.global_batch_size = layout_.global_batch_size;
  m.micro_batch_size = cfg_.training.micro_batch_size;
  m.grad_accum_steps = layout_.grad_accum_steps;
  return m;
}

void Trainer::restore(ckpt::Reader& reader) {
  // The buffers to read into: on a device, the host copies, which the reads fill whole
  // (a mismatch throws before any read), so the device's state is not copied down first.
  const auto own = state_tensors(false);
  // Stages and tensor slices: every rank reads the whole model tensor by tensor (the reads
  // are collective) and keeps its stage's tensors, its slices of them.
  const bool whole = stages_ > 1 || tensor_ > 1 || expert_storage_;
  std::vector<int> owner;
  const auto wanted = whole ? whole_model_tensors(false, owner) : own;
  // Every difference at once, so a wrong deck is diagnosed in one attempt.
  std::vector<std::string> problems;
  const auto shape_text = [](const std::vector<std::int64_t>& s) {
    std::string t = "(";
    for (std::size_t i = 0; i < s.size(); ++i)
      t += (i ? ", " : "") + std::to_string(s[i]);
    return t + ")";
  };
  for (const auto& w : wanted) {
    const ckpt::TensorInfo* have = reader.find(w.name);
    if (!have)
      problems.push_back(w.name + ": missing from the checkpoint (model wants " +
                         shape_text(w.shape) + ")");
    else if (have->shape != w.shape)
      problems.push_back(w.name + ": checkpoint " + shape_text(have->shape) + ", model " +
                         shape_text(w.shape));
  }
  for (const auto& have : reader.tensors()) {
    bool known = false;
    for (const auto& w : wanted)
      known = known || w.name == have.name;
    if (!known) problems.push_back(have.name + ": in the checkpoint but not in this model");
  }
  if (!problems.empty()) {
    std::string msg = "checkpoint '" + reader.path() + "' does not match this model (" +
                      std::to_string(problems.size()) + " tensors):";
    for (const auto& p : problems)
      msg += "\n  " + p;
    throw ckpt::CheckpointError(ckpt::CheckpointError::Kind::mismatch, msg);
  }
  if (!whole) {
    for (const auto& w : wanted)
      reader.read(w.name, w.shape, const_cast<float*>(w.data));
  } else {
    // One whole tensor at a time; this stage's tensors give this rank's slice of them.
    const auto& ps = model_->params();
    const auto index = index_by_name(own);
    std::vector<float> buffer;
    std::size_t kept = 0;
    for (std::size_t i = 0; i < wanted.size(); ++i) {
      std::size_t n = 1;
      for (const std::int64_t d : wanted[i].shape)
        n *= static_cast<std::size_t>(d);
      buffer.resize(n);
      reader.read(wanted[i].name, wanted[i].shape, buffer.data());
      const auto found = index.find(wanted[i].name);
      // Another stage's tensor, but for the embedding table of which the last stage holds a
      // copy (it is in this rank's store: every other stage's tensor is not).
      if (owner[i] != stage_ && found == index.end()) continue;
      if (found == index.end() && expert_owner(wanted[i].name) >= 0) continue;  // another's
      const std::size_t k = index.at(wanted[i].name);
      model::copy_slice_from_whole(ps.spec(k % ps.size()), buffer.data(),
                                   const_cast<float*>(own[k].data));
      ++kept;
    }
    if (kept != own.size())
      throw Error("trainer: restoring pipeline stage " + std::to_string(stage_) + ": " +
                  std::to_string(own.size() - kept) + " of its tensors are not in the whole model");
  }
  if (optimizer_->sharded()) {
    // ZeRO: the checkpoint's moments are whole (any stage, any world size wrote them);
    // this rank keeps its shard of them (per-rank experts: its two shards).
    for (const AdamW* o : {optimizer_.get(), expert_optimizer_.get()}) {
      if (!o) continue;
      const AdamWState st = o->state();
      const auto first = static_cast<std::ptrdiff_t>(st.first);
      const auto last = static_cast<std::ptrdiff_t>(st.first + st.elements);
      std::copy(host_m_.begin() + first, host_m_.begin() + last, st.m);
      std::copy(host_v_.begin() + first, host_v_.begin() + last, st.v);
      // The master's shard.
      if (master_shard_)
        std::copy(host_params_.begin() + first, host_params_.begin() + last, st.master);
    }
    std::vector<float>().swap(host_m_);
    std::vector<float>().swap(host_v_);
    if (master_shard_) {
      // The whole into the parameter buffer, which refresh_compute_params() below rounds
      // in place.
      const auto& ps = model_->params();
      std::copy(host_params_.begin(), host_params_.end(), ps.params_data());
      std::vector<float>().swap(host_params_);
    }
  } else if (tensor::device_of(ctx_) != tensor::Device::host) {
    const auto& ps = model_->params();
    const std::size_t bytes = ps.buffer_elements() * sizeof(float);
    tensor::copy(ctx_, ps.params_data(), host_params_.data(), bytes);
    tensor::copy(ctx_, optimizer_->state().m, host_m_.data(), bytes);
    tensor::copy(ctx_, optimizer_->state().v, host_v_.data(), bytes);
  }
  const ckpt::Metadata& m = reader.metadata();
  step_ = m.step;
  skipped_ = m.skipped_steps;
  samples_seen_ = m.samples_seen;
  optimizer_->set_step_count(m.optimizer_steps);
  if (expert_optimizer_) expert_optimizer_->set_step_count(m.optimizer_steps);
  batches_->seek({m.epoch, m.consumed});
  // training.precision may not change on resume (resume.hpp), so an fp16 checkpoint's
  // scale is a real one.
  if (loss_scaling_) scaler_.set_state(m.loss_scale, m.loss_scale_clean_steps);
  model_->refresh_compute_params();
}

StepSpread step_spread(const std::vector<double>& own_work, const std::vector<double>& own_comm,
                       const std::vector<double>& max_work, const std::vector<double>& min_work) {
  const std::size_t n = own_work.size();
  if (own_comm.size() != n || max_work.size() != n || min_work.size() != n)
    throw Error("train: step_spread needs one work, communication, maximum and minimum per step");
  StepSpread s;
  if (n == 0) return s;
  for (std::size_t k = 0; k < n; ++k) {
    s.straggle_s += max_work[k] - min_work[k];
    s.peer_wait_s += std::clamp(max_work[k] - own_work[k], 0.0, own_comm[k]);
  }
  s.straggle_s /= static_cast<double>(n);
  s.peer_wait_s /= static_cast<double>(n);
  return s;
}

Trainer::WorkSpread Trainer::work_spread(const std::vector<double>& work_s,
                                         const std::vector<double>& comm_s) {
  comm::Communicator& world = *groups_.world;
  const std::size_t n = work_s.size();
  const double mean =
      n > 0 ? std::accumulate(work_s.begin(), work_s.end(), 0.0) / static_cast<double>(n) : 0.0;
  // One all-reduce (max) of every step's work and its negative, and of the mean and its
  // negative: each step's maximum and minus its minimum, likewise for the means.
  std::vector<double> extremes(2 * n + 2);
  for (std::size_t k = 0; k < n; ++k) {
    extremes[k] = work_s[k];
    extremes[n + k] = -work_s[k];
  }
  extremes[2 * n] = mean;
  extremes[2 * n + 1] = -mean;
  world.allreduce(extremes.data(), extremes.size(), DType::f64, comm::ReduceOp::max);
  // The maximum is one rank's own value, bit for bit: the lowest rank holding it.
  std::int64_t slowest =
      mean == extremes[2 * n] ? world.rank() : std::numeric_limits<std::int64_t>::max();
  world.allreduce(&slowest, 1, DType::i64, comm::ReduceOp::min);
  std::vector<double> max_work(extremes.begin(), extremes.begin() + static_cast<std::ptrdiff_t>(n));
  std::vector<double> min_work(n);
  for (std::size_t k = 0; k < n; ++k)
    min_work[k] = -extremes[n + k];
  return WorkSpread{-extremes[2 * n + 1], extremes[2 * n], static_cast<int>(slowest),
                    step_spread(work_s, comm_s, max_work, min_work)};
}

void Trainer::check_consistency() {
  consistency_->check(model_->params(), ctx_, step_);
}

// --- expert parallelism's storage (parallel.expert > 1; layers/moe_dispatch.hpp) ----------

void Trainer::locate_own_experts() {
  const auto& ps = model_->params();
  expert_first_tensor_ = ps.size();
  for (std::size_t i = ps.size(); i-- > 0 && ps.spec(i).ep_size > 1;)
    expert_first_tensor_ = i;
  for (std::size_t i = 0; i < expert_first_tensor_; ++i)
    if (ps.spec(i).ep_size > 1)
      throw Error("trainer: the own experts' tensors are not the last of the store (" +
                  ps.spec(i).name + ")");
  if (expert_first_tensor_ == ps.size())
    throw Error("trainer: parallel.expert with no routed expert in this rank's store");
  expert_offset_ = ps.spec(expert_first_tensor_).offset;
}

void Trainer::make_expert_buckets(double bucket_bytes) {
  const auto& ps = model_->params();
  // Replicated tensors over the data group, in buckets that backward's ready() starts; the
  // own experts over the expert-data group, started by wait_all() after the backward.
  buckets_ = std::make_unique<GradBuckets>(*groups_.data, ps.grads_data(), expert_offset_,
                                           bucket_bytes, cfg_.parallel.overlap, ctx_);
  expert_buckets_ = std::make_unique<GradBuckets>(
      *groups_.expert_data, ps.grads_data() + expert_offset_, ps.buffer_elements() - expert_offset_,
      bucket_bytes, cfg_.parallel.overlap, ctx_);
}

std::int64_t Trainer::first_nonfinite_offset() const {
  const std::int64_t own = buckets_->first_nonfinite_offset();
  if (own >= 0 || !expert_buckets_) return own;
  const std::int64_t e = expert_buckets_->first_nonfinite_offset();
  return e >= 0 ? static_cast<std::int64_t>(expert_offset_) + e : -1;
}

int Trainer::expert_owner(const std::string& name) const {
  static const std::string kExperts = ".mlp.experts.";
  const std::size_t at = name.find(kExperts);
  if (!expert_storage_ || at == std::string::npos) return -1;
  const std::int64_t id = std::stoll(name.substr(at + kExperts.size()));
  return static_cast<int>(id / (cfg_.model.n_routed_experts / layout_.expert));
}

}  // namespace dst::train
