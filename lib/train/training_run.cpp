#include "train/training_run.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>

#include "blas/gemm.hpp"
#include "blas/host_blas.hpp"
#include "ckpt/param_dump.hpp"
#include "core/error.hpp"
#include "core/exit_codes.hpp"
#include "core/flight_recorder.hpp"
#include "core/log.hpp"
#include "core/parallel.hpp"
#include "core/step_context.hpp"
#include "core/version.hpp"
#include "model/plan.hpp"
#include "runtime/hang_watchdog.hpp"
#include "runtime/signals.hpp"
#include "tensor/memory.hpp"
#include "train/resume.hpp"

namespace dst::train {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// A loss scale as the step line prints it ("%g": 65536, 32768, 0.5).
std::string format_scale(double scale) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", scale);
  return buf;
}

/// A GPU's dense peak in GFLOP/s for the run's precision, from its data sheet: NVIDIA
/// H100 / H200 SXM (989.4 TFLOP/s bf16 and fp16 tensor cores without sparsity, 66.9
/// TFLOP/s fp32). 0 for other devices, the PCIe and NVL boards among them (lower clocks
/// and power: other figures): the MFU is then not reported.
double gpu_peak_gflops(const std::string& device_name, config::Precision precision) {
  const auto has = [&](const char* s) { return device_name.find(s) != std::string::npos; };
  const bool hopper_sxm = (has("H100") || has("H200")) && !has("PCIe") && !has("NVL");
  if (!hopper_sxm) return 0.0;
  return precision == config::Precision::fp32 ? 66.9e3 : 989.4e3;
}

std::string duration(double s) {
  const long t = static_cast<long>(s + 0.5);
  return std::to_string(t / 60) + "m" + (t % 60 < 10 ? "0" : "") + std::to_string(t % 60) + "s";
}

/// The context the model runs in: kernels.backend as resolved (cuda on a GPU build and
/// device, else kokkos) and kernels.host_gemm.
tensor::ExecContext make_context(runtime::Runtime& rt, const config::RunConfig& cfg,
                                 const runtime::Backends& backends) {
  tensor::ExecContext ctx;
  switch (cfg.kernels.host_gemm) {
    case config::HostGemmSetting::blas:
      ctx.host_gemm = tensor::HostGemm::blas;
      break;
    case config::HostGemmSetting::dstrain:
      ctx.host_gemm = tensor::HostGemm::own;
      break;
    case config::HostGemmSetting::automatic:
      ctx.host_gemm = tensor::HostGemm::automatic;
      break;
  }
  if (backends.kernels == ComputeBackend::cuda) {
    ctx.backend = tensor::Backend::cuda;
    ctx.stream = rt.compute_stream();
  }
  return ctx;
}

/// The trainer on the resolved back ends: with parallel.backend nccl the gradients are
/// summed by NCCL on the device, with shm in the data group's shared memory, else over MPI.
std::unique_ptr<Trainer> make_trainer(runtime::Runtime& rt, const config::RunConfig& cfg,
                                      const config::Layout& layout,
                                      const runtime::Backends& backends,
                                      comm::ProcessGroups& groups, data::SampleStore& train,
                                      const tensor::ExecContext& ctx) {
  Trainer::Options o;
  o.ctx = ctx;
  o.grad_comm = backends.comm;
  o.watchdog = &rt.watchdog();
  return std::make_unique<Trainer>(cfg, layout, groups, train, o);
}

}  // namespace

TrainingRun::TrainingRun(runtime::Runtime& rt, const config::RunConfig& config,
                         const config::Layout& layout, const runtime::Backends& backends,
                         comm::ProcessGroups& groups)
    : rt_(rt),
      cfg_(config),
      layout_(layout),
      root_(rt.rank() == 0),
      on_gpu_(backends.kernels == ComputeBackend::cuda) {
  const Faults faults(config.debug, rt.rank(), rt.size());
  // --- data: text files in memory, or HDF5 shards (from dstrain prep) read ahead
  data_ = TrainData::open(rt, config, layout, faults.read_delay_ms());
  const tensor::ExecContext ctx = make_context(rt, config, backends);
  // Fails here, on every rank, when the deck asks for dstrain's host kernels on a CPU that
  // cannot run them; root logs the choice with the peak.
  host_products_ = blas::describe_host_products(ctx);
  trainer_ = make_trainer(rt, config, layout, backends, groups, *data_.train, ctx);
  Trainer& trainer = *trainer_;

  // --- run directory; resume from a checkpoint (checkpoint.resume)
  const std::filesystem::path dir(config.run.output_dir);
  deck_yaml_ = config::to_yaml(config);
  if (root_) {
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "deck.yaml") << deck_yaml_;
  }
  checkpoints_ = std::make_unique<ckpt::Directory>(rt.world(), (dir / "checkpoints").string(),
                                                   config.parallel.timeout_s);
  checkpoints_->clean_leftovers();
  const ResumeOutcome resumed =
      resume_training(trainer, *checkpoints_, config, data_.tokenizer_name, *groups.world);
  for (const std::string& note : resumed.notes)
    if (root_) log::warn(note);  // the same on every rank
  first_step_ = trainer.steps_done();
  have_checkpoint_ = !resumed.file.empty();
  if (!resumed.file.empty())
    log::info("resumed from " + resumed.file + " at step " + std::to_string(resumed.step) +
              " (epoch " + std::to_string(trainer.sampler().position().epoch) + ", sample " +
              std::to_string(trainer.sampler().position().consumed) + "); next step " +
              std::to_string(first_step_ + 1) +
              (trainer.loss_scaling()
                   ? "; loss scale " + format_scale(trainer.loss_scaler().scale()) + " (" +
                         std::to_string(trainer.loss_scaler().clean_steps()) + " clean steps)"
                   : std::string()));
  else if (config.checkpoint.resume.kind == config::ResumeSetting::Kind::automatic)
    log::info("no checkpoint in " + checkpoints_->path() + ": starting at step 1");
  else if (const auto old = checkpoints_->committed(); root_ && !old.empty())
    log::warn("checkpoint.resume is none, but " + checkpoints_->path() + " holds " +
              std::to_string(old.size()) + (old.size() == 1 ? " checkpoint" : " checkpoints") +
              " of an earlier run (newest " + old.front() +
              "): this run replaces those of the same steps, the others count toward "
              "checkpoint.keep_last; use another run.output_dir to keep runs apart");
  // The initial weights only when no checkpoint was loaded: a restore overwrites every
  // parameter and moment, and drawing them costs minutes for a large model on one core.
  if (resumed.file.empty()) {
    const auto t_init = now_s();
    trainer.initialize_parameters();
    // Drawn on every CPU this rank may use (core::parallel_slices), the same bits on any.
    const unsigned cpus = core::usable_cpus();
    char line[160];
    std::snprintf(
        line, sizeof line, "initial weights: %s values drawn in %.2f s (%u %s)",
        model::format_count(static_cast<double>(trainer.logical_parameters().parameter_count()))
            .c_str(),
        now_s() - t_init, cpus, cpus == 1 ? "CPU" : "CPUs");
    log::info(line);
  }
  // training.stop_at_step ends this process early; the schedule still runs to max_steps.
  const std::int64_t max_steps = config.training.max_steps;
  last_step_ = config.training.stop_at_step > 0 ? std::min(config.training.stop_at_step, max_steps)
                                                : max_steps;
  trainer.read_ahead(std::max<std::int64_t>(0, last_step_ - first_step_));

  peak_gflops_ = config.logging.peak_gflops > 0 ? config.logging.peak_gflops
                 : on_gpu_ ? gpu_peak_gflops(rt.device().name, config.training.precision)
                 : root_   ? measure_cpu_peak_gflops()
                           : 0.0;
  groups.world->broadcast(&peak_gflops_, 1, DType::f64, 0);
  metrics_ = std::make_unique<MetricsLog>((dir / config.logging.metrics_file).string(), root_);
  metrics_->header(deck_yaml_, rt.size(), peak_gflops_);
  flops_per_token_ = model::training_flops_per_token(config.model, config.data.seq_len);
  log_start();
}

TrainingRun::~TrainingRun() = default;

void TrainingRun::log_start() const {
  const config::RunConfig& cfg = cfg_;
  const Trainer& trainer = *trainer_;
  const model::ParamCount params = model::count_parameters(cfg.model);
  const auto& sampler = trainer.sampler();
  log::info("model: " + cfg.model.preset + ", " +
            model::format_count(static_cast<double>(params.total())) + " parameters, " +
            model::format_count(flops_per_token_) + " FLOPs per token");
  log::info("data: " + std::to_string(data_.train_docs) + " documents, " +
            std::to_string(data_.train_tokens) + " tokens, " +
            std::to_string(sampler.config().num_samples) + " samples of " +
            std::to_string(cfg.data.seq_len) + " (" + std::to_string(sampler.steps_per_epoch()) +
            " steps per epoch); validation " + std::to_string(data_.valid_tokens) + " tokens");
  log::info("steps: " + std::to_string(cfg.training.max_steps) + " x global batch " +
            std::to_string(layout_.global_batch_size) + " (micro-batch " +
            std::to_string(cfg.training.micro_batch_size) + " x " +
            std::to_string(layout_.grad_accum_steps) + " accumulation x " +
            std::to_string(layout_.data) + " data ranks) = " +
            std::to_string(layout_.global_batch_size * cfg.data.seq_len) + " tokens per step");
  if (trainer.own_experts_only()) {
    // Which state each rank holds (the expert-parallel tests read this line).
    const std::int64_t E = cfg.parallel.expert;
    log::info("experts: each rank stores its own " +
              std::to_string(cfg.model.n_routed_experts / E) + " of " +
              std::to_string(cfg.model.n_routed_experts) + " routed experts per MoE layer" +
              (cfg.parallel.zero_stage > 0
                   ? ", their ZeRO shards over the " + std::to_string(layout_.data / E) +
                         " ranks holding them, the other tensors' over the " +
                         std::to_string(layout_.data) + " data ranks"
                   : std::string()));
  }
  char peak_line[200];
  if (on_gpu_)
    std::snprintf(peak_line, sizeof peak_line,
                  peak_gflops_ > 0
                      ? "peak: %.1f TFLOP/s per rank (%s, dense %s, data sheet) x %d ranks"
                      : "peak: %.0f (no data-sheet peak known for %s in %s: MFU not "
                        "reported) x %d ranks",
                  peak_gflops_ / 1e3, rt_.device().name.c_str(),
                  to_string(cfg.training.precision).c_str(), rt_.size());
  else
    std::snprintf(peak_line, sizeof peak_line,
                  "peak: %.1f GFLOP/s per rank (single-thread SGEMM 2048^3, %s kernels) x %d ranks",
                  peak_gflops_, blas::host_blas().kernels.c_str(), rt_.size());
  log::info(peak_line);
  if (!on_gpu_)
    log::info("host products: " + host_products_ + " (kernels.host_gemm " +
              to_string(cfg.kernels.host_gemm) + ")");
  if (cfg.training.precision != config::Precision::fp32)
    log::info("precision: " + to_string(cfg.training.precision) +
              " (fp32 master weights and moments; " +
              (on_gpu_ ? "values rounded to 16 bits in fp32 storage, products on tensor cores"
                       : "16-bit storage emulated on the host") +
              (trainer.loss_scaling()
                   ? "; dynamic loss scale " + format_scale(trainer.loss_scaler().scale())
                   : std::string()) +
              "; docs/precision.md)");
  if (on_gpu_)
    log::info(std::string("attention: ") +
              (trainer_->model().fused_attention()
                   ? "fused (cuDNN SDPA)"
                   : "unfused (products and softmax over the T x T scores" +
                         std::string(cfg.debug.deterministic ? "; debug.deterministic" : "") +
                         ")"));
  log::info("run directory: " + cfg.run.output_dir);
}

void TrainingRun::save_checkpoint() {
  Trainer& trainer = *trainer_;
  ckpt::Metadata meta = trainer.checkpoint_metadata();
  meta.deck_yaml = deck_yaml_;
  meta.software_version = "dstrain " + core::version() + " (git " + core::git_hash() + ")";
  meta.tokenizer_name = data_.tokenizer_name;
  core::FlightScope scope("checkpoint save at step " + std::to_string(trainer.steps_done()));
  ckpt::SaveFaults faults;
  faults.exit_rank = trainer.faults().checkpoint_exit_rank(have_checkpoint_);
  try {
    // One whole tensor at a time (Trainer::checkpoint_stream): stages and tensor slices are
    // assembled tensor by tensor, not as the whole state on every rank.
    const Trainer::CheckpointStream stream = trainer.checkpoint_stream();
    const ckpt::IoStats io =
        checkpoints_->save(meta, stream.tensors, stream.source, cfg_.checkpoint.keep_last, faults);
    char line[256];
    std::snprintf(line, sizeof line,
                  "checkpoint: %s (%.1f MB) written in %.2f s (%.2f GB/s%s), committed in %.2f s",
                  io.path.c_str(), static_cast<double>(io.bytes) / 1e6, io.seconds, io.gbps(),
                  io.collective ? ", collective" : "", io.total_seconds);
    log::info(line);
  } catch (const ckpt::CheckpointError& e) {
    // What a restart would resume from (the failed save left nothing behind).
    const std::string newest = checkpoints_->latest();
    throw CollectiveError(std::string("checkpoint failed: ") + e.what() + "; " +
                              (newest.empty() ? std::string("no checkpoint of this run yet")
                                              : "the newest checkpoint is " + newest),
                          kExitCheckpoint);
  }
  have_checkpoint_ = true;
  saved_this_run_ = true;
  last_saved_step_ = trainer.steps_done();
}

void TrainingRun::after_step(const StepStats& st, std::int64_t done) {
  Trainer& trainer = *trainer_;
  last_loss_ = st.loss;
  tokens_since_ += layout_.global_batch_size * cfg_.data.seq_len;
  seconds_since_ += st.seconds;
  phase_sum_.t_data += st.t_data;
  phase_sum_.t_forward += st.t_forward;
  phase_sum_.t_backward += st.t_backward;
  phase_sum_.t_comm += st.t_comm;
  phase_sum_.t_optimizer += st.t_optimizer;
  phase_sum_.t_alltoall += st.t_alltoall;
  phase_sum_.alltoall_bytes += st.alltoall_bytes;
  phase_sum_.t_tensor += st.t_tensor;
  phase_sum_.tensor_bytes += st.tensor_bytes;
  phase_sum_.seconds += st.seconds;
  ++phase_steps_;
  step_work_.push_back(st.t_data + st.t_forward + st.t_backward);
  step_comm_.push_back(st.t_comm);
  if (cfg_.debug.consistency_every > 0 && done % cfg_.debug.consistency_every == 0)
    trainer.check_consistency();
  if (done % cfg_.logging.every_steps == 0 || done == last_step_ || st.skipped) {
    const double tps =
        seconds_since_ > 0 ? static_cast<double>(tokens_since_) / seconds_since_ : 0.0;
    const double mfu =
        peak_gflops_ > 0 ? flops_per_token_ * tps / (peak_gflops_ * 1e9 * rt_.size()) : 0.0;
    const double elapsed = now_s() - run_start_;
    const double eta =
        elapsed / static_cast<double>(done - first_step_) * static_cast<double>(last_step_ - done);
    log::info(metrics_->step(
        st, cfg_.training.max_steps, tps, mfu, eta,
        on_gpu_ ? tensor::peak_device_bytes(tensor::Device::cuda) : peak_resident_bytes(),
        trainer.skipped_steps()));
    tokens_since_ = 0;
    seconds_since_ = 0.0;
    if (done % (5 * cfg_.logging.every_steps) == 0 || done == last_step_) {
      // Every rank: how evenly the ranks worked, step by step (a straggler shows as rank
      // 0's exposed communication; this names the rank and says how much of it is the
      // wait for the straggler).
      log::info(metrics_->phases(done, phase_sum_, phase_steps_,
                                 trainer.work_spread(step_work_, step_comm_), rt_.size()));
      phase_sum_ = {};
      phase_steps_ = 0;
      step_work_.clear();
      step_comm_.clear();
    }
  }
  if (cfg_.eval.every_steps > 0 && done % cfg_.eval.every_steps == 0 && done != last_step_ &&
      data_.valid->num_samples() > 0) {
    const auto [loss, tokens] = trainer.evaluate(*data_.valid, cfg_.eval.batches);
    log::info(metrics_->eval(done, loss, tokens));
  }
}

int TrainingRun::run() {
  Trainer& trainer = *trainer_;
  const std::int64_t max_steps = cfg_.training.max_steps;
  run_start_ = now_s();
  if (first_step_ >= last_step_)
    log::info("the checkpoint is at step " + std::to_string(first_step_) +
              ", training.max_steps is " + std::to_string(max_steps) + ": no steps to run");
  // From here on a rank that stops making progress ends the job (parallel.timeout_s).
  runtime::HangWatchdog watchdog(cfg_.parallel.timeout_s);
  for (std::int64_t s = first_step_; s < last_step_; ++s) {
    core::set_current_step(s + 1);
    trainer.faults().before_step(s + 1, saved_this_run_);
    if (trainer.faults().hangs_in_alltoallv(saved_this_run_)) trainer.arm_alltoallv_hang();
    const StepStats st = trainer.step();
    const std::int64_t done = st.step + 1;
    after_step(st, done);
    if (st.stop_ranks > 0) {
      // Every rank saw the same count in the step's all-reduce: all stop here together.
      const int mine = runtime::stop_signal();
      log::info("stop requested (" +
                (mine ? runtime::signal_name(mine) + " on this rank, " : std::string()) +
                std::to_string(st.stop_ranks) + " of " + std::to_string(rt_.size()) +
                " ranks signalled) after step " + std::to_string(done) + ": saving a checkpoint");
      if (last_saved_step_ != done) save_checkpoint();
      log::info("stopped after step " + std::to_string(done) + " of " + std::to_string(max_steps) +
                " on request; checkpoint committed; exit code " + std::to_string(kExitPreempted) +
                " (requeue to resume)");
      return kExitPreempted;
    }
    if (cfg_.checkpoint.every_steps > 0 && done % cfg_.checkpoint.every_steps == 0 &&
        done != last_step_)
      save_checkpoint();
  }
  if (last_saved_step_ != trainer.steps_done() && trainer.steps_done() > first_step_)
    save_checkpoint();
  finish(now_s() - run_start_);
  return kExitOk;
}

void TrainingRun::finish(double seconds) {
  Trainer& trainer = *trainer_;
  const std::int64_t max_steps = cfg_.training.max_steps;
  const std::int64_t ran = std::max<std::int64_t>(0, last_step_ - first_step_);
  std::string summary = "done: " + std::to_string(ran) + " steps in " + duration(seconds);
  if (last_step_ < max_steps)
    summary += " | stopped after step " + std::to_string(last_step_) + " of " +
               std::to_string(max_steps) + " (training.stop_at_step; resume to continue)";
  char buf[160];
  std::snprintf(buf, sizeof buf, " | final train loss %.4f", last_loss_);
  summary += buf;
  if (data_.valid->num_samples() > 0) {
    const auto [loss, tokens] = trainer.evaluate(*data_.valid, cfg_.eval.batches);
    log::info(metrics_->eval(trainer.steps_done(), loss, tokens));
    std::string note;
    const std::optional<double> bigram = data_.bigram_baseline(cfg_.model.vocab_size, root_, note);
    std::snprintf(buf, sizeof buf, " | val loss %.4f", loss);
    summary += buf;
    if (bigram) {
      std::snprintf(buf, sizeof buf, " | bigram baseline %.4f (%s)", *bigram,
                    loss < *bigram ? "beaten" : "NOT beaten");
      summary += buf;
    }
    summary += note;
  }
  const std::filesystem::path dir(cfg_.run.output_dir);
  // Tensor by tensor (collective; ZeRO with bf16/fp16: the fp32 master's shards gathered),
  // written by rank 0.
  const Trainer::CheckpointStream params = trainer.checkpoint_stream(true);
  ckpt::write_parameters_h5((dir / "final-params.h5").string(), params.tensors, params.source,
                            trainer.steps_done(), root_);
  if (trainer.skipped_steps() > 0)
    summary += " | " + std::to_string(trainer.skipped_steps()) + " steps skipped";
  log::info(summary);
  log::info("run directory: " + dir.string() + " (deck.yaml, " + cfg_.logging.metrics_file +
            ", final-params.h5, checkpoints/)");
}

}  // namespace dst::train
