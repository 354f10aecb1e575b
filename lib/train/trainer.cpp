#include "train/trainer.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <numeric>
#include <optional>
#include <sstream>

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
  Forward forward(int chunk, std::int64_t micro, std::size_t record, bool with_gradient) override {
    model::LanguageModel& model = *t_.model_;
    const std::int64_t B = t_.cfg_.training.micro_batch_size;
    const std::int64_t T = t_.cfg_.data.seq_len;
    if (with_gradient)
      split_rows(rows + static_cast<std::size_t>(micro * B * (T + 1)), B, T, t_.tokens_.data(),
                 t_.targets_.data());
    const model::MicroBatchResult r =
        model.stage_forward(record, t_.tokens_.data(), t_.targets_.data(),
                            with_gradient ? backward_scale : 1.0f, with_gradient);
    if (with_gradient && t_.balancer_->own_blocks() > 0)
      t_.balancer_->keep_terms(micro, chunk, r.aux_losses);
    return {r.loss_sum, r.valid_tokens, r.mtp_loss_sum, r.forward_seconds};
  }
  double backward(std::size_t r, const std::function<void(std::size_t)>& on_ready) override {
    return t_.model_->stage_backward(r, on_ready);
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
  // may still get it). `any_expert_storage`: some stage stores them (the
  // consistency check of the own experts is collective over the world).
  const bool storage_allowed =
      layout.expert > 1 &&
      (config.parallel.zero_stage == 0 || options.grad_comm == runtime::CommBackend::mpi);
  expert_storage_ = storage_allowed && model::own_expert_storage(config, groups.pipeline_rank);
  bool any_expert_storage = false;
  for (int s = 0; s < static_cast<int>(layout.pipeline); ++s)
    any_expert_storage =
        any_expert_storage || (storage_allowed && model::own_expert_storage(config, s));
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
    if (groups.world->rank() == 0) log::info(PipelineExecutor::describe(layout, chunks_, chunks));
  }
  if (tensor_ > 1 && tensor::device_of(ctx_) != tensor::Device::host)
    throw Error("trainer: parallel.tensor " + std::to_string(tensor_) +
                " needs the model in host memory (the tensor group reduces host buffers over "
                "MPI; not built for devices yet)");
  // How the gradients become the update, with the memory the model's store lives in.
  GradSync::Setup sync;
  sync.config = &config;
  sync.groups = &groups;
  sync.ctx = ctx_;
  sync.backend = options.grad_comm;
  sync.watchdog = options.watchdog;
  sync.elements = model::flat_buffer_elements(
      model::stage_parameter_layout(config.model, chunks, slice, experts));
  sync.own_experts = expert_storage_;
  sync_ = GradSync::make(sync);
  model::ModelOptions mo;
  mo.ctx = ctx_;
  mo.storage = model::storage_type(config.training.precision);
  mo.deterministic = config.debug.deterministic;
  mo.gradient_memory = sync_->grad_memory();
  mo.param_memory = sync_->param_memory();
  mo.recompute = config.training.recompute;
  mo.master_outside = sync_->master_shard();
  mo.chunks = chunks;
  mo.tp = slice;
  mo.ep = experts;
  model_ = std::make_unique<model::LanguageModel>(config.model, micro, T,
                                                  tensor::Arena::Mode::allocate, mo);
  sync_->attach(model_->params());
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
  loss_scaling_ = config.training.precision == config::Precision::fp16;
  data::SamplerConfig sc;
  sc.num_samples = train.num_samples();
  sc.seed = config.run.seed;
  sc.global_batch_size = static_cast<std::uint64_t>(layout.global_batch_size);
  sc.micro_batch_size = static_cast<std::uint64_t>(micro);
  sc.dp_rank = groups.data_rank;
  sc.dp_size = layout.data;
  batches_ = std::make_unique<data::BatchSource>(train, sc, T);
  const auto& ps = model_->params();
  // Faults::gradient_poison's gradient: of this stage's last block (expert parallelism:
  // this rank's first expert).
  poison_offset_ =
      Faults::poison_offset(config.model, ps, model_->chunks().back().last - 1,
                            experts.rank * (config.model.n_routed_experts / experts.size));
  whole_ = std::make_unique<WholeModel>(config, layout, stage_, expert_storage_);
  const std::size_t own_experts_from = sync_->own_experts().first_tensor;
  checkpoint_ = std::make_unique<CheckpointState>(config, layout, groups, ps, *sync_, *whole_,
                                                  expert_storage_);
  global_norm_ = std::make_unique<GlobalNorm>(whole_->norm_parts(groups, ps, own_experts_from));
  nonfinite_ = std::make_unique<NonFiniteNamer>(*groups.world, layout, logical_parameters());
  ConsistencyChecker::Replicas replicas;
  replicas.stage = stage_;
  replicas.whole = whole_->layout();
  replicas.own_experts = expert_storage_;
  replicas.own_experts_from = own_experts_from;
  replicas.any_stage_own_experts = any_expert_storage;
  replicas.shared_embedding = model::stages_share_embedding(config);
  replicas.tied = config.model.tie_embeddings;
  consistency_ = std::make_unique<ConsistencyChecker>(groups, layout, replicas);
  batch_.resize(static_cast<std::size_t>(layout.grad_accum_steps * micro * (T + 1)));
  tokens_.resize(static_cast<std::size_t>(micro * T));
  targets_.resize(tokens_.size());
}

Trainer::~Trainer() = default;

void Trainer::initialize_parameters() {
  model_->params().initialize(cfg_.run.seed);
  sync_->initialize(*model_);
}

StepStats Trainer::step() {
  core::set_current_step(step_ + 1);  // as the log counts: from 1
  StepStats st;
  st.step = step_;
  const auto t_step = Clock::now();

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
  sync_->begin_step();
  const std::optional<float> poison = faults_.gradient_poison(step_);
  bool injected = false;
  auto on_ready = [&](std::size_t offset) {
    if (poison && !injected && offset <= poison_offset_) {
      tensor::copy(ctx_, ps.grads_data() + poison_offset_, &*poison, sizeof(float));
      injected = true;
    }
    sync_->ready(offset);
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
    const bool last = m + 1 == micro_batches;
    core::FlightScope scope("forward+backward of micro-batch " + std::to_string(m + 1) + "/" +
                            std::to_string(micro_batches));
    const model::MicroBatchResult r = model_->forward_backward(
        tokens_.data(), targets_.data(), backward_scale,
        last ? std::function<void(std::size_t)>(on_ready) : std::function<void(std::size_t)>());
    passes.loss_sum += r.loss_sum;
    passes.valid += r.valid_tokens;
    passes.aux_sum += r.aux_loss();
    passes.mtp_sum += r.mtp_loss_sum;
    st.t_forward += r.forward_seconds;
    st.t_backward += r.backward_seconds;
  }
  const double p2p_s = st.t_comm;  // the pipeline's exposed sends and receives
  st.t_comm = sync_->wait_all() + p2p_s;
  if (tensor_parallel_) {
    st.t_tensor = tensor_parallel_->traffic().seconds;
    st.tensor_bytes = static_cast<double>(tensor_parallel_->traffic().bytes);
  }
  if (experts_) {
    const model::ExpertTraffic& tr = experts_->traffic();
    st.t_alltoall = tr.seconds;
    st.alltoall_bytes = static_cast<double>(tr.bytes_sent + tr.bytes_received);
    // Every data rank's row count in one call; whole numbers, so their sum in any order
    // is the all-reduce's.
    const double own = static_cast<double>(tr.rows_received);
    std::vector<double> rows(static_cast<std::size_t>(groups_.data->size()));
    groups_.data->allgather(&own, rows.data(), 1, DType::f64);
    st.expert_rows_max = *std::max_element(rows.begin(), rows.end());
    st.expert_rows_mean = std::accumulate(rows.begin(), rows.end(), 0.0) / layout_.data;
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
  sums[kNonfinite] = sync_->first_nonfinite_offset() >= 0 ? 1.0 : 0.0;
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
  std::vector<double> per_tensor;
  const double sum_of_squares = sync_->norm_sums(norm_, per_tensor);
  return global_norm_->sum_of_squares(model_->params(), std::move(per_tensor), sum_of_squares);
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
  std::ostringstream os;
  os << "non-finite gradients at step " << step_ << ": "
     << nonfinite_->name(model_->params(), ctx_, sync_->first_nonfinite_offset(),
                         sync_->summed_ranges());
  if (cfg_.debug.nan_policy == config::NanPolicy::abort)
    throw CollectiveError(os.str() + " (debug.nan_policy: abort)", kExitDiverged);
  st.skipped = true;  // every rank decides alike: parameters and moments stay untouched
  ++skipped_;
}

double Trainer::update(StepStats& st, double scale) {
  const double factor = clip_factor(st.grad_norm, cfg_.training.grad_clip);
  const double gathered_s = sync_->update(*model_, st.lr, scale * factor);
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

void Trainer::arm_alltoallv_hang() {
  if (!experts_)
    throw Error(
        "trainer: debug.inject_hang_alltoallv_rank needs parallel.expert > 1 and an MoE "
        "model (there is no expert all-to-all to hang in)");
  experts_->hang_before_next_rows();
}

void Trainer::balance_moe(StepStats& st, double aux_sum) {
  const MoeBalancer::Sums sums =
      balancer_->reduce(model_->moe_loads(), model_->moe_dropped(), aux_sum);
  model_->reset_moe_loads();
  // The bias follows the optimizer: a skipped step moves nothing.
  if (!st.skipped) {
    model_->update_moe_bias(sums.loads, cfg_.model.moe.bias_update_rate);
    sync_->bias_moved(*model_, static_cast<std::size_t>(cfg_.model.n_routed_experts));
  }
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
      const model::MicroBatchResult r = model_->forward(tokens_.data(), targets_.data());
      sums[0] += r.loss_sum;
      v = r.valid_tokens;
    }
    sums[1] += static_cast<double>(v);
  }
  groups_.data->allreduce(sums, 2, DType::f64, comm::ReduceOp::sum);
  if (stages_ > 1) groups_.pipeline->allreduce(sums, 2, DType::f64, comm::ReduceOp::sum);
  model_->reset_moe_loads();  // balancing counts the training batches' routing only
  return {sums[1] > 0 ? sums[0] / sums[1] : 0.0, static_cast<std::int64_t>(sums[1])};
}

CheckpointStream Trainer::checkpoint_stream(const bool params_only) const {
  return checkpoint_->stream(params_only);
}

ckpt::Metadata Trainer::checkpoint_metadata() const {
  ckpt::Metadata m;
  m.step = step_;
  m.epoch = sampler().position().epoch;
  m.consumed = sampler().position().consumed;
  m.samples_seen = samples_seen_;
  m.optimizer_steps = sync_->optimizer_steps();
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
  checkpoint_->read(reader);
  const ckpt::Metadata& m = reader.metadata();
  step_ = m.step;
  skipped_ = m.skipped_steps;
  samples_seen_ = m.samples_seen;
  sync_->restored(m.optimizer_steps);
  batches_->seek({m.epoch, m.consumed});
  // training.precision may not change on resume (resume.hpp), so an fp16 checkpoint's
  // scale is a real one.
  if (loss_scaling_) scaler_.set_state(m.loss_scale, m.loss_scale_clean_steps);
  model_->refresh_compute_params();
}

void Trainer::check_consistency() {
  consistency_->check(model_->params(), ctx_, step_);
}

}  // namespace dst::train
