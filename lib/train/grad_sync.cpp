#include "train/grad_sync.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include <sys/mman.h>

#include "comm/nccl_bootstrap.hpp"
#include "comm/shared_sum.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "tensor/memory.hpp"

namespace dst::train {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// Names a start-up step for the watchdog (none without one).
std::unique_ptr<runtime::StartupStep> startup_step(const GradSync::Setup& setup, const char* what,
                                                   double timeout_s) {
  return setup.watchdog ? std::make_unique<runtime::StartupStep>(*setup.watchdog, what, timeout_s)
                        : nullptr;
}

/// Every rank holds the whole optimizer state; the gradients are all-reduced in buckets
/// over MPI, or over an NCCL communicator of the data group on the model's stream.
class Replicated final : public GradSync {
 public:
  Replicated(const Setup& setup, int zero_stage) : GradSync(setup, zero_stage) {
    if (setup.backend == runtime::CommBackend::nccl) {
      const auto s = startup_step(setup, "NCCL communicator of the data group", 0.0);  // NCCL polls
      device_comm_ = comm::make_device_communicator(*groups_.data, "data", cfg_.parallel.timeout_s,
                                                    cfg_.parallel.init_timeout_s, ctx_.stream);
    }
  }
  ~Replicated() override { release_buckets(); }  // before the communicator they sum over

  double norm_sums(GradNorm& norm, std::vector<double>& per_tensor) override {
    const double total = norm.compute(ctx_, *store_);
    per_tensor = norm.per_tensor();
    return total;
  }

 private:
  void make_parts(model::ParamStore& store) override {
    const double bytes = bucket_bytes(cfg_);
    const bool overlap = cfg_.parallel.overlap;
    if (own_experts_wanted_) {
      // The replicated tensors over the data group, in buckets that backward's ready()
      // starts; the own experts over the expert-data group, started by wait_all().
      buckets_ = std::make_unique<GradBuckets>(*groups_.data, store.grads_data(),
                                               own_experts_.offset, bytes, overlap, ctx_);
      expert_buckets_ = std::make_unique<GradBuckets>(
          *groups_.expert_data, store.grads_data() + own_experts_.offset,
          store.buffer_elements() - own_experts_.offset, bytes, overlap, ctx_);
    } else {
      buckets_ = std::make_unique<GradBuckets>(device_comm_ ? *device_comm_ : *groups_.data,
                                               store.grads_data(), store.buffer_elements(), bytes,
                                               overlap, ctx_);
    }
    optimizer_ = std::make_unique<AdamW>(cfg_.training.optimizer, store);
  }

  double apply(model::LanguageModel&, double lr, double grad_scale) override {
    optimizer_->step(ctx_, *store_, lr, grad_scale);
    return 0.0;
  }

  std::unique_ptr<comm::Communicator> device_comm_;
};

/// The data group's ranks share one node: gradients and parameters live in its shared
/// memory, summed there; each rank updates its part of the flat buffers (SharedSum::
/// part_of), gathered in place. The moments outside the part are gathered for a
/// checkpoint only; with ZeRO the rank holds its part's moments alone.
class Shared final : public GradSync {
 public:
  Shared(const Setup& setup, int zero_stage) : GradSync(setup, zero_stage) {
    // The gradients (buffer kGrads) and parameters (kParams), with a slot per bucket and
    // one for the parameters' gather.
    const auto s =
        startup_step(setup, "shared-memory gradient and parameter buffers of the data group",
                     cfg_.parallel.init_timeout_s);
    shared_ = std::make_unique<comm::SharedSum>(
        *groups_.data, setup.elements,
        GradBuckets::bucket_count_for(setup.elements, bucket_bytes(cfg_)) + 1, 2);
    grad_memory_ = shared_->local(kGrads);
    param_memory_ = shared_->local(kParams);
    gather_slot_ = shared_->slots() - 1;
  }
  ~Shared() override { release_buckets(); }  // before the shared buffers they sum in

  double norm_sums(GradNorm& norm, std::vector<double>& per_tensor) override {
    // The ranks sharing the update share the norm too (the gradients are replicated).
    const double total = updating_together() ? norm.compute_shared(ctx_, *store_, *groups_.data)
                                             : norm.compute(ctx_, *store_);
    per_tensor = norm.per_tensor();
    return total;
  }

 private:
  static constexpr std::size_t kGrads = 0;
  static constexpr std::size_t kParams = 1;

  /// One rank alone has nothing to share: it updates its own parameters.
  bool updating_together() const { return shared_->size() > 1; }

  void make_parts(model::ParamStore& store) override {
    buckets_ = std::make_unique<GradBuckets>(*shared_, bucket_bytes(cfg_), cfg_.parallel.overlap);
    if (zero_stage_ > 0) {
      // The parts the ranks already update.
      shards_ = std::make_unique<ZeroShards>(
          zero_shards(store, own_experts_, groups_.data->size(), 1, true).replicated);
      const int r = groups_.data->rank();
      optimizer_ = std::make_unique<AdamW>(cfg_.training.optimizer, store, shards_->first(r),
                                           shards_->last(r), master_shard_);
    } else {
      optimizer_ = std::make_unique<AdamW>(cfg_.training.optimizer, store);
    }
  }

  double apply(model::LanguageModel& model, double lr, double grad_scale) override {
    if (!updating_together()) {
      optimizer_->step(ctx_, *store_, lr, grad_scale);
      return 0.0;
    }
    // This rank's part of the update, then every rank's part into every rank's parameters
    // (the moments stay in parts: gather_parts() for a checkpoint).
    std::size_t first = 0, last = 0;
    comm::SharedSum::part_of(store_->buffer_elements(), shared_->size(), shared_->rank(), first,
                             last);
    optimizer_->step(ctx_, *store_, lr, grad_scale, first, last);
    // A master shard: the rounded copy of the shard is what the ranks gather.
    if (master_shard_) model.refresh_compute_params(optimizer_->state().master, first, last);
    shared_->igather(gather_slot_, 0, store_->buffer_elements(), kParams).wait();
    return 0.0;
  }

  void gather_parts() override {
    if (!updating_together() || sharded()) return;
    gather_in_place(optimizer_->state().m);
    gather_in_place(optimizer_->state().v);
  }

  /// Gathers the flat buffer `data` (the moments) across the shared ranks, through the
  /// gradient buffer (free between steps).
  void gather_in_place(float* data) const {
    comm::SharedSum& shared = *shared_;
    const std::size_t n = shared.elements();
    std::size_t first = 0, last = 0;
    comm::SharedSum::part_of(n, shared.size(), shared.rank(), first, last);
    float* through = shared.local(kGrads);
    std::memcpy(through + first, data + first, (last - first) * sizeof(float));
    shared.igather(gather_slot_, 0, n, kGrads).wait();
    // The peers' parts: everything before and after this rank's (parts are in rank order).
    std::memcpy(data, through, first * sizeof(float));
    std::memcpy(data + last, through + last, (n - last) * sizeof(float));
  }

  std::unique_ptr<comm::SharedSum> shared_;
  std::size_t gather_slot_ = 0;
};

/// ZeRO over MPI: the gradients reduce-scattered onto shards of whole tensors (exact
/// norms), the shard updated, the parameters all-gathered bucket by bucket. Own experts:
/// their part of the buffer is sharded over the expert-data group, with an optimizer of
/// its own that steps with the first.
class Zero final : public GradSync {
 public:
  Zero(const Setup& setup, int zero_stage) : GradSync(setup, zero_stage) {
    if (zero_stage_ == 2) map_gradient_pages(setup.elements);
  }
  ~Zero() override { release_buckets(); }  // before the pages they release

  double norm_sums(GradNorm& norm, std::vector<double>& per_tensor) override {
    const AdamWState st = optimizer_->state();
    const double total =
        norm.compute_sharded(ctx_, *store_, st.first, st.first + st.elements, *groups_.data);
    per_tensor = norm.per_tensor();
    if (expert_optimizer_) {
      // The own experts' sums are the expert-data group's shards' (the call above summed
      // the data group's shards of the replicated tensors, the experts' entries +0).
      const AdamWState ex = expert_optimizer_->state();
      norm.compute_sharded(ctx_, *store_, ex.first, ex.first + ex.elements, *groups_.expert_data);
      const std::vector<double>& own = norm.per_tensor();
      const auto from = static_cast<std::ptrdiff_t>(own_experts_.first_tensor);
      std::copy(own.begin() + from, own.end(), per_tensor.begin() + from);
    }
    return total;
  }

  std::vector<std::pair<std::size_t, std::size_t>> summed_ranges() const override {
    std::vector<std::pair<std::size_t, std::size_t>> out;
    for (const AdamW* o : {optimizer_.get(), expert_optimizer_.get()})
      if (o) out.emplace_back(o->state().first, o->state().first + o->state().elements);
    return out;
  }

 private:
  /// Stage 2: gradient memory of pages nobody has touched (an allocation of the store's
  /// own is zero-filled by writing it, which would make it all resident): pages take
  /// memory only when backward writes them, and GradBuckets returns them. Huge pages where
  /// the system gives them (transparent huge pages on madvise): a fault per 2 MiB instead
  /// of per 4 KiB when backward writes them again each step.
  void map_gradient_pages(std::size_t elements) {
    constexpr std::size_t kHuge = std::size_t{2} << 20;
    const std::size_t bytes = elements * sizeof(float);
    const std::size_t mapped = bytes + kHuge;
    void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      throw Error("trainer: cannot map " + std::to_string(mapped) +
                  " bytes of gradient memory (parallel.zero_stage 2)");
    auto* aligned =
        reinterpret_cast<void*>((reinterpret_cast<std::uintptr_t>(p) + kHuge - 1) / kHuge * kHuge);
    (void)::madvise(aligned, bytes, MADV_HUGEPAGE);  // advice: without it, 4 KiB pages
    pages_ = std::shared_ptr<void>(aligned, [p, mapped](void*) { ::munmap(p, mapped); });
    grad_memory_ = static_cast<float*>(aligned);
  }

  void make_parts(model::ParamStore& store) override {
    const double bytes = bucket_bytes(cfg_);
    const bool overlap = cfg_.parallel.overlap;
    Shards shards = zero_shards(store, own_experts_, groups_.data->size(),
                                own_experts_wanted_ ? groups_.expert_data->size() : 1, false);
    shards_ = std::make_unique<ZeroShards>(std::move(shards.replicated));
    const int r = groups_.data->rank();
    optimizer_ = std::make_unique<AdamW>(cfg_.training.optimizer, store, shards_->first(r),
                                         shards_->last(r), master_shard_);
    buckets_ = std::make_unique<GradBuckets>(*groups_.data, store.grads_data(), *shards_, bytes,
                                             overlap, zero_stage_ == 2);
    if (!own_experts_wanted_) return;
    // The own experts' replicas are the expert-data group: their shards are its ranks'
    // (offsets relative to the experts' part), reduce-scattered by wait_all() after the
    // backward.
    const std::size_t at = own_experts_.offset;
    expert_shards_ = std::move(shards.own_experts);
    const int e = groups_.expert_data->rank();
    expert_optimizer_ =
        std::make_unique<AdamW>(cfg_.training.optimizer, store, at + expert_shards_->first(e),
                                at + expert_shards_->last(e), master_shard_);
    expert_buckets_ =
        std::make_unique<GradBuckets>(*groups_.expert_data, store.grads_data() + at,
                                      *expert_shards_, bytes, overlap, zero_stage_ == 2);
  }

  void zero_gradients() override {
    if (zero_stage_ != 2) return GradSync::zero_gradients();
    // Stage 2: zeroed by returning the buffer's pages (resident again only while
    // backward writes them and their bucket is in flight).
    buckets_->clear();
    if (expert_buckets_) expert_buckets_->clear();
  }

  double apply(model::LanguageModel& model, double lr, double grad_scale) override {
    // The shards' update, then every shard into every rank's parameters: communication
    // (the phase's t_comm), not the optimizer's time. A master shard: the rounded copy of
    // the shard is what the ranks gather.
    for (AdamW* o : {optimizer_.get(), expert_optimizer_.get()}) {
      if (!o) continue;
      const AdamWState st = o->state();
      o->step(ctx_, *store_, lr, grad_scale, st.first, st.first + st.elements);
      if (master_shard_) model.refresh_compute_params(st.master, st.first, st.first + st.elements);
    }
    return gather_parameters();
  }

  /// All-gathers the updated parameters (this rank's shards final) bucket by bucket, the
  /// gradient buckets' ranges; returns the seconds it took.
  double gather_parameters() {
    const auto t0 = Clock::now();
    float* params = store_->params_data();
    std::vector<comm::Request> requests;
    const auto gather = [&](const GradBuckets& b, comm::Communicator& group,
                            const ZeroShards& shards, float* base) {
      for (std::size_t i = 0; i < b.bucket_count(); ++i)
        requests.push_back(
            group.iallgather_blocks(base + b.bucket_begin(i),
                                    shards.counts(b.bucket_begin(i), b.bucket_end(i)), DType::f32));
    };
    gather(*buckets_, *groups_.data, *shards_, params);
    if (expert_shards_)
      gather(*expert_buckets_, *groups_.expert_data, *expert_shards_, params + own_experts_.offset);
    for (auto& r : requests)
      r.wait();
    return since(t0);
  }

  /// Stage 2's gradient memory, which the model's store uses (the trainer keeps the
  /// strategy longer than the model).
  std::shared_ptr<void> pages_;
};

}  // namespace

OwnExperts locate_own_experts(const model::ParamStore& store) {
  OwnExperts own;
  own.first_tensor = store.size();
  for (std::size_t i = store.size(); i-- > 0 && store.spec(i).ep_size > 1;)
    own.first_tensor = i;
  for (std::size_t i = 0; i < own.first_tensor; ++i)
    if (store.spec(i).ep_size > 1)
      throw Error("trainer: the own experts' tensors are not the last of the store (" +
                  store.spec(i).name + ")");
  if (own.first_tensor == store.size())
    throw Error("trainer: parallel.expert with no routed expert in this rank's store");
  own.offset = store.spec(own.first_tensor).offset;
  return own;
}

bool holds_own_experts(const model::ParamStore& store) {
  return store.size() > 0 && store.spec(store.size() - 1).ep_size > 1;
}

double GradSync::bucket_bytes(const config::RunConfig& cfg) {
  return cfg.parallel.bucket_mb * 1024.0 * 1024.0;
}

GradSync::Shards GradSync::zero_shards(const model::ParamStore& store, const OwnExperts& own,
                                       int data_ranks, int expert_data_ranks, bool shared) {
  const std::size_t n = store.buffer_elements();
  Shards out{shared ? ZeroShards::by_parts(own.offset, data_ranks)
                    : ZeroShards::by_tensors(store, data_ranks, 0, own.offset),
             nullptr};
  if (own.offset < n)
    out.own_experts = std::make_unique<ZeroShards>(
        ZeroShards::by_tensors(store, expert_data_ranks, own.offset, n));
  return out;
}

std::unique_ptr<GradSync> GradSync::make(const Setup& setup) {
  const config::RunConfig& cfg = *setup.config;
  comm::ProcessGroups& groups = *setup.groups;
  // ZeRO: one data rank has nothing to shard (the stage does nothing: say so). A device's
  // gradients and moments: the NCCL back end has the shard collectives, but the path here
  // (buckets onto shards, shard norm, checkpoint gathers, stage 2's pages) is host-only.
  int zero_stage = static_cast<int>(cfg.parallel.zero_stage);
  if (zero_stage > 0 && groups.data->size() == 1) {
    if (groups.world->rank() == 0)
      log::warn("parallel.zero_stage " + std::to_string(zero_stage) +
                " does nothing with one data rank: every rank holds the whole optimizer state "
                "(as zero_stage 0)");
    zero_stage = 0;
  }
  const bool device = tensor::device_of(setup.ctx) != tensor::Device::host;
  if (zero_stage > 0 && (device || setup.backend == runtime::CommBackend::nccl))
    throw Error("trainer: parallel.zero_stage " + std::to_string(zero_stage) +
                " needs the model in host memory and the mpi or shm back end (a device's "
                "reduce-scatter onto shards is not built yet); set parallel.zero_stage: 0");
  if (setup.own_experts && setup.backend != runtime::CommBackend::mpi)
    throw Error("trainer: parallel.expert " + std::to_string(groups.expert->size()) +
                " holds each rank's own routed experts, summed over the expert-data group: "
                "not built with the shm and nccl back ends (set parallel.backend: mpi)");
  switch (setup.backend) {
    case runtime::CommBackend::shm:
      return std::make_unique<Shared>(setup, zero_stage);
    case runtime::CommBackend::mpi:
      if (zero_stage > 0) return std::make_unique<Zero>(setup, zero_stage);
      return std::make_unique<Replicated>(setup, zero_stage);
    default:
      return std::make_unique<Replicated>(setup, zero_stage);
  }
}

GradSync::GradSync(const Setup& setup, int zero_stage)
    : cfg_(*setup.config),
      groups_(*setup.groups),
      ctx_(setup.ctx),
      own_experts_wanted_(setup.own_experts),
      zero_stage_(zero_stage),
      master_shard_(zero_stage > 0 && setup.config->training.precision != config::Precision::fp32) {
}

GradSync::~GradSync() = default;

void GradSync::attach(model::ParamStore& store) {
  if (store_) throw Error("train::GradSync: attached to a store twice");
  store_ = &store;
  own_experts_ = own_experts_wanted_ ? locate_own_experts(store)
                                     : OwnExperts{store.size(), store.buffer_elements()};
  make_parts(store);
}

void GradSync::release_buckets() {
  expert_buckets_.reset();
  buckets_.reset();
}

void GradSync::zero_gradients() {
  store_->zero_grads();
}

void GradSync::begin_step() {
  if (sharded()) {
    // The moments gathered whole for the last checkpoint are no longer viewed.
    std::vector<float>().swap(host_m_);
    std::vector<float>().swap(host_v_);
    if (master_shard_) std::vector<float>().swap(host_params_);
  }
  zero_gradients();
  buckets_->reset();
  if (expert_buckets_) expert_buckets_->reset();
}

double GradSync::wait_all() {
  double waited = buckets_->wait_all();
  // Expert parallelism: the own experts' gradients over the expert-data group (started here).
  if (expert_buckets_) waited += expert_buckets_->wait_all();
  return waited;
}

std::int64_t GradSync::first_nonfinite_offset() const {
  const std::int64_t own = buckets_->first_nonfinite_offset();
  if (own >= 0 || !expert_buckets_) return own;
  const std::int64_t e = expert_buckets_->first_nonfinite_offset();
  return e >= 0 ? static_cast<std::int64_t>(own_experts_.offset) + e : -1;
}

std::vector<std::pair<std::size_t, std::size_t>> GradSync::summed_ranges() const {
  return {{0, store_->buffer_elements()}};
}

double GradSync::update(model::LanguageModel& model, double lr, double grad_scale) {
  const double gathered_s = apply(model, lr, grad_scale);
  // The rounded copy of the new master parameters (a master shard: gathered by apply()).
  if (!master_shard_) model.refresh_compute_params();
  tensor::synchronize(ctx_);  // the optimizer's phase ends when a device has run it
  return gathered_s;
}

void GradSync::initialize(model::LanguageModel& model) {
  if (master_shard_) {
    // The master's shard from the fp32 values, then the buffer rounded in place.
    for (const AdamW* o : {optimizer_.get(), expert_optimizer_.get()}) {
      if (!o) continue;
      const AdamWState st = o->state();
      tensor::copy(ctx_, st.master, store_->params_data() + st.first, st.elements * sizeof(float));
    }
  }
  model.refresh_compute_params();
}

void GradSync::bias_moved(const model::LanguageModel& model, std::size_t experts) {
  if (!master_shard_) return;
  // The buffer keeps the biases in fp32 (the router's), moved alike on every rank: the
  // owner of each element in its master shard takes the new value.
  const AdamWState st = optimizer_->state();
  const float* params = store_->params_data();
  for (const std::size_t at : model.moe_bias_offsets())
    for (std::size_t o = at; o < at + experts; ++o)
      if (o >= st.first && o < st.first + st.elements) st.master[o - st.first] = params[o];
}

void GradSync::gather_shards(float* whole, const float* mine, const float* mine_experts) const {
  const AdamWState st = optimizer_->state();
  std::copy(mine, mine + st.elements, whole + st.first);
  groups_.data->iallgather_blocks(whole, shards_->sizes(), DType::f32).wait();
  if (!expert_optimizer_) return;
  const AdamWState ex = expert_optimizer_->state();
  std::copy(mine_experts, mine_experts + ex.elements, whole + ex.first);
  groups_.expert_data
      ->iallgather_blocks(whole + own_experts_.offset, expert_shards_->sizes(), DType::f32)
      .wait();
}

GradSync::State GradSync::saved(const bool params_only) {
  if (!params_only) gather_parts();
  const std::size_t n = store_->buffer_elements();
  State s{store_->params_data(), nullptr, nullptr};
  if (!params_only) {
    s.m = optimizer_->state().m;
    s.v = optimizer_->state().v;
  }
  if (sharded()) {
    // ZeRO (host memory): the moments of every shard gathered whole, and with a master
    // shard the parameters too (the model's buffer holds the rounded copy).
    const AdamWState st = optimizer_->state();
    const AdamWState ex = expert_optimizer_ ? expert_optimizer_->state() : AdamWState{};
    const auto gather = [&](std::vector<float>& whole, const float* mine, const float* experts) {
      whole.resize(n);
      gather_shards(whole.data(), mine, experts);
      return whole.data();
    };
    if (!params_only) {
      s.m = gather(host_m_, st.m, ex.m);
      s.v = gather(host_v_, st.v, ex.v);
    }
    if (master_shard_) s.params = gather(host_params_, st.master, ex.master);
  } else if (tensor::device_of(ctx_) != tensor::Device::host) {
    // A device's state copied down.
    const auto down = [&](std::vector<float>& host, const float* from) {
      host.resize(n);
      tensor::copy(ctx_, host.data(), from, n * sizeof(float));
      return host.data();
    };
    s.params = down(host_params_, s.params);
    if (!params_only) {
      s.m = down(host_m_, s.m);
      s.v = down(host_v_, s.v);
    }
  }
  return s;
}

GradSync::State GradSync::to_restore() {
  State s{store_->params_data(), optimizer_->state().m, optimizer_->state().v};
  const std::size_t n = store_->buffer_elements();
  if (sharded()) {
    // The checkpoint's moments are whole: read into host copies, of which restored()
    // keeps this rank's shards.
    host_m_.resize(n);
    host_v_.resize(n);
    s.m = host_m_.data();
    s.v = host_v_.data();
    if (master_shard_) {
      host_params_.resize(n);
      s.params = host_params_.data();
    }
  } else if (tensor::device_of(ctx_) != tensor::Device::host) {
    // Read into host copies whole (a mismatch throws before any read), copied up after.
    for (auto* h : {&host_params_, &host_m_, &host_v_})
      h->resize(n);
    s = State{host_params_.data(), host_m_.data(), host_v_.data()};
  }
  return s;
}

void GradSync::restored(std::int64_t optimizer_steps) {
  if (sharded()) {
    // Any stage and world size wrote the moments whole: this rank keeps its shard of them
    // (own experts: its two shards), and of the master's.
    for (const AdamW* o : {optimizer_.get(), expert_optimizer_.get()}) {
      if (!o) continue;
      const AdamWState st = o->state();
      const auto first = static_cast<std::ptrdiff_t>(st.first);
      const auto last = static_cast<std::ptrdiff_t>(st.first + st.elements);
      std::copy(host_m_.begin() + first, host_m_.begin() + last, st.m);
      std::copy(host_v_.begin() + first, host_v_.begin() + last, st.v);
      if (master_shard_)
        std::copy(host_params_.begin() + first, host_params_.begin() + last, st.master);
    }
    std::vector<float>().swap(host_m_);
    std::vector<float>().swap(host_v_);
    if (master_shard_) {
      // The whole into the parameter buffer, which the model's refresh rounds in place.
      std::copy(host_params_.begin(), host_params_.end(), store_->params_data());
      std::vector<float>().swap(host_params_);
    }
  } else if (tensor::device_of(ctx_) != tensor::Device::host) {
    const std::size_t bytes = store_->buffer_elements() * sizeof(float);
    tensor::copy(ctx_, store_->params_data(), host_params_.data(), bytes);
    tensor::copy(ctx_, optimizer_->state().m, host_m_.data(), bytes);
    tensor::copy(ctx_, optimizer_->state().v, host_v_.data(), bytes);
  }
  optimizer_->set_step_count(optimizer_steps);
  if (expert_optimizer_) expert_optimizer_->set_step_count(optimizer_steps);
}

}  // namespace dst::train
