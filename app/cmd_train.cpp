#include <cblas.h>
#include <glob.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "blas/gemm.hpp"
#include "blas/host_blas.hpp"
#include "ckpt/checkpoint.hpp"
#include "comm/nccl_bootstrap.hpp"
#include "commands.hpp"
#include "core/error.hpp"
#include "core/exit_codes.hpp"
#include "core/flight_recorder.hpp"
#include "core/log.hpp"
#include "core/parallel.hpp"
#include "core/step_context.hpp"
#include "core/version.hpp"
#include "data/byte_vocab.hpp"
#include "data/dataset/token_dataset.hpp"
#include "model/plan.hpp"
#include "runtime/hang_watchdog.hpp"
#include "runtime/signals.hpp"
#include "session.hpp"
#include "tensor/memory.hpp"
#include "train/baseline.hpp"
#include "train/hdf5_store.hpp"
#include "train/metrics.hpp"
#include "train/param_dump.hpp"
#include "train/resume.hpp"
#include "train/text_store.hpp"
#include "train/trainer.hpp"

namespace dst::app {

namespace {

/// data.train / data.valid: comma-separated paths, each may be a glob.
std::vector<std::string> expand_paths(const std::string& spec, const char* key) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= spec.size()) {
    const std::size_t comma = spec.find(',', start);
    const std::string item =
        spec.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) {
      glob_t g{};
      const int rc = ::glob(item.c_str(), 0, nullptr, &g);
      if (rc == 0) {
        for (std::size_t i = 0; i < g.gl_pathc; ++i)
          out.emplace_back(g.gl_pathv[i]);
      } else {
        globfree(&g);
        throw DeckError(key, "", "no file matches '" + item + "'");
      }
      globfree(&g);
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (out.empty()) throw DeckError(key, "", "no data files given");
  return out;
}

bool is_text(const config::DataSection& d) {
  if (d.format != config::DataFormat::automatic) return d.format == config::DataFormat::text;
  return d.train.size() >= 4 && d.train.compare(d.train.size() - 4, 4, ".txt") == 0;
}

/// The bigram baseline reads every token on one rank: above this many (train + valid)
/// it is skipped, since 50 M int32 tokens are already 200 MB and seconds of reading.
constexpr std::uint64_t kBigramMaxTokens = 50'000'000;

/// A run's training and validation samples: text files (byte-level, in memory) or HDF5
/// shards (data.format hdf5, or auto with a path not ending in .txt) read by a
/// BatchReader.
struct RunData {
  std::unique_ptr<train::SampleStore> train, valid;  // valid: possibly empty
  train::Hdf5SampleStore* train_h5 = nullptr;        // HDF5: follows the sampler
  train::Hdf5SampleStore* valid_h5 = nullptr;
  std::uint64_t train_docs = 0, train_tokens = 0, valid_tokens = 0;
  std::string tokenizer_name;  ///< identity of the tokenizer the data was made with
};

/// Opens data.train / data.valid on every rank (HDF5: collectively, rank 0 reading the
/// headers). A problem is reported once and ends the job with the deck exit code.
RunData load_run_data(runtime::Runtime& rt, const config::RunConfig& cfg,
                      const config::Layout& layout) {
  RunData d;
  std::string problem;
  try {
    if (cfg.data.train.empty()) throw DeckError("data.train", "", "no training data configured");
    if (is_text(cfg.data)) {
      if (cfg.model.vocab_size < data::kByteVocabSize)
        throw DeckError("model.vocab_size", "",
                        "text data uses the byte-level vocabulary of " +
                            std::to_string(data::kByteVocabSize) + " tokens; got " +
                            std::to_string(cfg.model.vocab_size));
      std::int64_t docs = 0;
      auto train_tokens = data::load_text_stream(expand_paths(cfg.data.train, "data.train"),
                                                 cfg.data.text_separator, &docs);
      std::vector<std::int32_t> valid_tokens;
      if (!cfg.data.valid.empty())
        valid_tokens = data::load_text_stream(expand_paths(cfg.data.valid, "data.valid"),
                                              cfg.data.text_separator);
      d.train_docs = static_cast<std::uint64_t>(docs);
      d.tokenizer_name = "byte260";
      d.train_tokens = train_tokens.size();
      d.valid_tokens = valid_tokens.size();
      d.train = std::make_unique<train::TextSampleStore>(std::move(train_tokens), cfg.data.seq_len);
      d.valid = std::make_unique<train::TextSampleStore>(std::move(valid_tokens), cfg.data.seq_len);
    } else {
      // The reader's thread calls MPI-IO while this one runs collectives: prefetch only
      // when MPI allows that (the runtime asks for MPI_THREAD_MULTIPLE).
      data::BatchReaderOptions ro;
      ro.prefetch = rt.thread_level() == "multiple";
      ro.inject_read_delay_ms = static_cast<int>(cfg.debug.inject_read_delay_ms);
      const int T = static_cast<int>(cfg.data.seq_len);
      const data::TokenDataset train_ds = data::open_dataset(rt.world(), cfg.data.train, T);
      if (train_ds.vocab_size() > static_cast<std::uint64_t>(cfg.model.vocab_size))
        throw DeckError("model.vocab_size", "",
                        "is " + std::to_string(cfg.model.vocab_size) + " but the shards of '" +
                            cfg.data.train + "' (tokenizer " + train_ds.tokenizer().name +
                            ") use " + std::to_string(train_ds.vocab_size()) + " ids");
      d.tokenizer_name = train_ds.tokenizer().name;
      for (const auto& h : train_ds.shards())
        d.train_docs += h.num_documents;
      d.train_tokens = train_ds.num_tokens();
      auto train = std::make_unique<train::Hdf5SampleStore>(train_ds, ro);
      d.train_h5 = train.get();
      d.train = std::move(train);
      if (!cfg.data.valid.empty()) {
        const data::TokenDataset valid_ds = data::open_dataset(rt.world(), cfg.data.valid, T);
        if (!(valid_ds.tokenizer() == train_ds.tokenizer()))
          throw DeckError("data.valid", "",
                          "tokenizer " + valid_ds.tokenizer().name + " (" +
                              valid_ds.tokenizer().hash + ") differs from data.train's " +
                              train_ds.tokenizer().name + " (" + train_ds.tokenizer().hash + ")");
        d.valid_tokens = valid_ds.num_tokens();
        // Evaluation reads a few batches at a time and waits for them: no read-ahead.
        data::BatchReaderOptions vo = ro;
        vo.prefetch = false;
        auto valid = std::make_unique<train::Hdf5SampleStore>(valid_ds, vo);
        d.valid_h5 = valid.get();
        d.valid = std::move(valid);
      } else {
        d.valid =
            std::make_unique<train::TextSampleStore>(std::vector<std::int32_t>{}, cfg.data.seq_len);
      }
    }
    const auto samples = d.train->num_samples();
    if (samples < static_cast<std::uint64_t>(layout.global_batch_size))
      throw DeckError("data.train", "",
                      "has " + std::to_string(samples) + " samples of " +
                          std::to_string(cfg.data.seq_len) +
                          " tokens, fewer than one global batch (" +
                          std::to_string(layout.global_batch_size) + ")");
  } catch (const Error& e) {
    problem = e.what();
  }
  runtime::agree_or_fail(rt.world(), problem.empty(), "cannot load the training data: " + problem,
                         kExitDeck, cfg.parallel.init_timeout_s, "data");
  return d;
}

/// The bigram baseline of the run's data (rank 0; nullopt elsewhere), or nullopt with a
/// stated reason when the HDF5 data is too large to count on one rank.
std::optional<double> bigram_baseline(const RunData& d, const config::RunConfig& cfg, bool root,
                                      std::string& note) {
  if (!root) return std::nullopt;
  const auto vocab = static_cast<std::int32_t>(cfg.model.vocab_size);
  if (!d.train_h5) {
    const auto& t = static_cast<const train::TextSampleStore&>(*d.train).stream();
    const auto& v = static_cast<const train::TextSampleStore&>(*d.valid).stream();
    return train::bigram_cross_entropy(t, v, vocab);
  }
  if (!d.valid_h5) return std::nullopt;
  if (d.train_tokens + d.valid_tokens > kBigramMaxTokens) {
    note = " | bigram baseline skipped (" + std::to_string(d.train_tokens + d.valid_tokens) +
           " tokens > " + std::to_string(kBigramMaxTokens) + ")";
    return std::nullopt;
  }
  return train::bigram_cross_entropy(
      train::read_token_stream(d.train_h5->dataset(), d.train_tokens),
      train::read_token_stream(d.valid_h5->dataset(), d.valid_tokens), vocab);
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

}  // namespace

int run_train(runtime::Runtime& rt, const Command& cmd) {
  // One BLAS thread per rank (one rank per core is the CPU layout) unless the user says
  // otherwise; the MFU peak is per core too.
  if (!std::getenv("OPENBLAS_NUM_THREADS") && !std::getenv("OMP_NUM_THREADS"))
    openblas_set_num_threads(1);
  // A stop signal from here on ends the run at the next step boundary with a checkpoint.
  runtime::install_stop_handlers();
  Session session = start_session(rt, cmd.check.deck, cmd.check.overrides, "train");
  const config::RunConfig& cfg = session.config;
  const config::Layout& layout = session.layout;
  const bool root = rt.rank() == 0;

  // --- data: text files in memory, or HDF5 shards (from dstrain prep) read ahead
  RunData run_data = load_run_data(rt, cfg, layout);
  train::SampleStore& train_store = *run_data.train;
  train::SampleStore& valid_store = *run_data.valid;

  // kernels.backend (resolved: cuda on a GPU build and device, else kokkos) decides where
  // the model runs; with parallel.backend nccl the gradients are summed by NCCL on the
  // device, everything else over MPI.
  tensor::ExecContext ctx;
  ctx.host_gemm = cfg.kernels.host_gemm == config::HostGemmSetting::blas ? tensor::HostGemm::blas
                  : cfg.kernels.host_gemm == config::HostGemmSetting::dstrain
                      ? tensor::HostGemm::own
                      : tensor::HostGemm::automatic;
  std::unique_ptr<comm::Communicator> grad_comm;
  if (session.backends.kernels == tensor::Backend::cuda) {
    ctx.backend = tensor::Backend::cuda;
    ctx.stream = rt.compute_stream();
    if (session.backends.comm == runtime::CommBackend::nccl) {
      runtime::StartupStep step(rt.watchdog(), "NCCL communicator of the data group", 0.0);
      grad_comm =
          comm::make_device_communicator(*session.groups.data, "data", cfg.parallel.timeout_s,
                                         cfg.parallel.init_timeout_s, ctx.stream);
    }
  }
  // Fails here, on every rank, when the deck asks for dstrain's host kernels on a CPU that
  // cannot run them; root logs the choice with the peak below.
  const std::string host_products = blas::describe_host_products(ctx);
  // parallel.backend shm: the gradients and parameters live in the data group's shared
  // memory, and its ranks share the optimizer's update.
  std::unique_ptr<comm::SharedSum> shared_grads;
  if (session.backends.comm == runtime::CommBackend::shm) {
    runtime::StartupStep step(rt.watchdog(),
                              "shared-memory gradient and parameter buffers of the data group",
                              rt.init_timeout_s());
    shared_grads = train::Trainer::make_shared_buffers(cfg, *session.groups.data);
  }
  train::Trainer trainer(cfg, layout, session.groups, train_store, ctx, grad_comm.get(),
                         shared_grads.get());

  // --- run directory; resume from a checkpoint (checkpoint.resume)
  const std::filesystem::path dir(cfg.run.output_dir);
  const std::string deck_yaml = config::to_yaml(cfg);
  if (root) {
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "deck.yaml") << deck_yaml;
  }
  ckpt::Directory checkpoints(rt.world(), (dir / "checkpoints").string(), cfg.parallel.timeout_s);
  checkpoints.clean_leftovers();
  const train::ResumeOutcome resumed = train::resume_training(
      trainer, checkpoints, cfg, run_data.tokenizer_name, *session.groups.world);
  for (const std::string& note : resumed.notes)
    if (root) log::warn(note);  // the same on every rank
  const std::int64_t first_step = trainer.steps_done();
  if (!resumed.file.empty())
    log::info("resumed from " + resumed.file + " at step " + std::to_string(resumed.step) +
              " (epoch " + std::to_string(trainer.sampler().position().epoch) + ", sample " +
              std::to_string(trainer.sampler().position().consumed) + "); next step " +
              std::to_string(first_step + 1) +
              (trainer.loss_scaling()
                   ? "; loss scale " + format_scale(trainer.loss_scaler().scale()) + " (" +
                         std::to_string(trainer.loss_scaler().clean_steps()) + " clean steps)"
                   : std::string()));
  else if (cfg.checkpoint.resume.kind == config::ResumeSetting::Kind::automatic)
    log::info("no checkpoint in " + checkpoints.path() + ": starting at step 1");
  else if (const auto old = checkpoints.committed(); root && !old.empty())
    log::warn("checkpoint.resume is none, but " + checkpoints.path() + " holds " +
              std::to_string(old.size()) + (old.size() == 1 ? " checkpoint" : " checkpoints") +
              " of an earlier run (newest " + old.front() +
              "): this run replaces those of the same steps, the others count toward "
              "checkpoint.keep_last; use another run.output_dir to keep runs apart");
  // The initial weights only when no checkpoint was loaded: a restore overwrites every
  // parameter and moment, and drawing them costs minutes for a large model on one core.
  if (resumed.file.empty()) {
    const auto t_init = std::chrono::steady_clock::now();
    trainer.initialize_parameters();
    // Drawn on every CPU this rank may use (core::parallel_slices), the same bits on any.
    const unsigned cpus = core::usable_cpus();
    char line[160];
    std::snprintf(
        line, sizeof line, "initial weights: %s values drawn in %.2f s (%u %s)",
        model::format_count(static_cast<double>(trainer.model().params().parameter_count()))
            .c_str(),
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t_init).count(), cpus,
        cpus == 1 ? "CPU" : "CPUs");
    log::info(line);
  }
  const std::int64_t max_steps = cfg.training.max_steps;
  // training.stop_at_step ends this process early; the schedule still runs to max_steps.
  const std::int64_t last_step =
      cfg.training.stop_at_step > 0 ? std::min(cfg.training.stop_at_step, max_steps) : max_steps;
  if (run_data.train_h5)
    run_data.train_h5->follow(trainer.sampler(), std::max<std::int64_t>(0, last_step - first_step));

  // Saves a checkpoint of the state after `trainer.steps_done()` steps (collective).
  bool have_checkpoint = !resumed.file.empty();
  bool saved_this_run = false;
  std::int64_t last_saved_step = -1;
  const auto save_checkpoint = [&]() {
    ckpt::Metadata meta = trainer.checkpoint_metadata();
    meta.deck_yaml = deck_yaml;
    meta.software_version = "dstrain " + core::version() + " (git " + core::git_hash() + ")";
    meta.tokenizer_name = run_data.tokenizer_name;
    core::FlightScope scope("checkpoint save at step " + std::to_string(trainer.steps_done()));
    ckpt::SaveFaults faults;
    // debug.inject_exit_in_checkpoint: the last rank dies half-way through a write once an
    // earlier checkpoint exists, so the test can check that one still loads.
    if (cfg.debug.inject_exit_in_checkpoint && have_checkpoint) faults.exit_rank = rt.size() - 1;
    try {
      const ckpt::IoStats io =
          checkpoints.save(meta, trainer.checkpoint_tensors(), cfg.checkpoint.keep_last, faults);
      char line[256];
      std::snprintf(line, sizeof line,
                    "checkpoint: %s (%.1f MB) written in %.2f s (%.2f GB/s%s), committed in %.2f s",
                    io.path.c_str(), static_cast<double>(io.bytes) / 1e6, io.seconds, io.gbps(),
                    io.collective ? ", collective" : "", io.total_seconds);
      log::info(line);
    } catch (const ckpt::CheckpointError& e) {
      throw CollectiveError(std::string("checkpoint failed: ") + e.what(), kExitCheckpoint);
    }
    have_checkpoint = true;
    saved_this_run = true;
    last_saved_step = trainer.steps_done();
  };
  const bool on_gpu = ctx.backend == tensor::Backend::cuda;
  double peak = on_gpu ? gpu_peak_gflops(rt.device().name, cfg.training.precision)
                : root ? train::measure_cpu_peak_gflops()
                       : 0.0;
  session.groups.world->broadcast(&peak, 1, DType::f64, 0);
  train::MetricsLog metrics((dir / cfg.logging.metrics_file).string(), root);
  metrics.header(deck_yaml, rt.size(), peak);

  const model::ParamCount params = model::count_parameters(cfg.model);
  const double flops_per_token = model::training_flops_per_token(cfg.model, cfg.data.seq_len);
  const auto& sampler_cfg = trainer.sampler().config();
  log::info("model: " + cfg.model.preset + ", " +
            model::format_count(static_cast<double>(params.total())) + " parameters, " +
            model::format_count(flops_per_token) + " FLOPs per token");
  log::info("data: " + std::to_string(run_data.train_docs) + " documents, " +
            std::to_string(run_data.train_tokens) + " tokens, " +
            std::to_string(sampler_cfg.num_samples) + " samples of " +
            std::to_string(cfg.data.seq_len) + " (" +
            std::to_string(trainer.sampler().steps_per_epoch()) + " steps per epoch); validation " +
            std::to_string(run_data.valid_tokens) + " tokens");
  log::info("steps: " + std::to_string(cfg.training.max_steps) + " x global batch " +
            std::to_string(layout.global_batch_size) + " (micro-batch " +
            std::to_string(cfg.training.micro_batch_size) + " x " +
            std::to_string(layout.grad_accum_steps) + " accumulation x " +
            std::to_string(layout.data) + " data ranks) = " +
            std::to_string(layout.global_batch_size * cfg.data.seq_len) + " tokens per step");
  char peak_line[200];
  if (on_gpu)
    std::snprintf(peak_line, sizeof peak_line,
                  peak > 0 ? "peak: %.1f TFLOP/s per rank (%s, dense %s, data sheet) x %d ranks"
                           : "peak: %.0f (no data-sheet peak known for %s in %s: MFU not "
                             "reported) x %d ranks",
                  peak / 1e3, rt.device().name.c_str(), to_string(cfg.training.precision).c_str(),
                  rt.size());
  else
    std::snprintf(peak_line, sizeof peak_line,
                  "peak: %.1f GFLOP/s per rank (single-thread SGEMM 2048^3, %s kernels) x %d ranks",
                  peak, blas::host_blas().kernels.c_str(), rt.size());
  log::info(peak_line);
  if (!on_gpu)
    log::info("host products: " + host_products + " (kernels.host_gemm " +
              to_string(cfg.kernels.host_gemm) + ")");
  if (cfg.training.precision != config::Precision::fp32)
    log::info("precision: " + to_string(cfg.training.precision) +
              " (fp32 master weights and moments; " +
              (on_gpu ? "values rounded to 16 bits in fp32 storage, products on tensor cores"
                      : "16-bit storage emulated on the host") +
              (trainer.loss_scaling()
                   ? "; dynamic loss scale " + format_scale(trainer.loss_scaler().scale())
                   : std::string()) +
              "; docs/precision.md)");
  if (on_gpu)
    log::info(std::string("attention: ") +
              (trainer.model().fused_attention()
                   ? "fused (cuDNN SDPA)"
                   : "unfused (products and softmax over the T x T scores" +
                         std::string(cfg.debug.deterministic ? "; debug.deterministic" : "") +
                         ")"));
  log::info("run directory: " + dir.string());

  // --- the loop
  const auto t_start = std::chrono::steady_clock::now();
  train::StepStats phase_sum;
  std::int64_t phase_steps = 0, tokens_since = 0;
  // This rank's work (data + forward + backward) and exposed communication of each step
  // since the last phases record (Trainer::work_spread compares them across the ranks).
  std::vector<double> step_work, step_comm;
  double seconds_since = 0.0, last_loss = 0.0;
  if (first_step >= last_step)
    log::info("the checkpoint is at step " + std::to_string(first_step) +
              ", training.max_steps is " + std::to_string(max_steps) + ": no steps to run");
  // From here on a rank that stops making progress ends the job (parallel.timeout_s).
  runtime::HangWatchdog watchdog(cfg.parallel.timeout_s);
  int exit_code = kExitOk;
  for (std::int64_t s = first_step; s < last_step; ++s) {
    core::set_current_step(s + 1);
    // debug.inject_hang_rank / inject_exit_rank: once this run has committed a checkpoint
    // (so the tests can check it stays intact), that rank hangs (alive, stuck, no
    // progress) or dies.
    if (saved_this_run && cfg.debug.inject_exit_rank == rt.rank()) {
      log::warn("debug.inject_exit_rank: exiting at step " + std::to_string(s + 1));
      std::fflush(nullptr);
      std::_Exit(kExitInjected);
    }
    if (saved_this_run && cfg.debug.inject_hang_rank == rt.rank()) {
      log::warn("debug.inject_hang_rank: hanging at step " + std::to_string(s + 1));
      core::FlightScope hang("debug.inject_hang_rank: a deliberate hang");
      for (;;)
        std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    const train::StepStats st = trainer.step();
    const std::int64_t done = st.step + 1;
    last_loss = st.loss;
    tokens_since += layout.global_batch_size * cfg.data.seq_len;
    seconds_since += st.seconds;
    phase_sum.t_data += st.t_data;
    phase_sum.t_forward += st.t_forward;
    phase_sum.t_backward += st.t_backward;
    phase_sum.t_comm += st.t_comm;
    phase_sum.t_optimizer += st.t_optimizer;
    phase_sum.seconds += st.seconds;
    ++phase_steps;
    step_work.push_back(st.t_data + st.t_forward + st.t_backward);
    step_comm.push_back(st.t_comm);
    if (cfg.debug.consistency_every > 0 && done % cfg.debug.consistency_every == 0)
      trainer.check_consistency();
    if (done % cfg.logging.every_steps == 0 || done == last_step || st.skipped) {
      const double tps =
          seconds_since > 0 ? static_cast<double>(tokens_since) / seconds_since : 0.0;
      const double mfu = peak > 0 ? flops_per_token * tps / (peak * 1e9 * rt.size()) : 0.0;
      const double elapsed =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
      const double eta =
          elapsed / static_cast<double>(done - first_step) * static_cast<double>(last_step - done);
      log::info(metrics.step(
          st, max_steps, tps, mfu, eta,
          on_gpu ? tensor::peak_device_bytes(tensor::Device::cuda) : train::peak_resident_bytes(),
          trainer.skipped_steps()));
      tokens_since = 0;
      seconds_since = 0.0;
      if (done % (5 * cfg.logging.every_steps) == 0 || done == last_step) {
        // Every rank: how evenly the ranks worked, step by step (a straggler shows as rank
        // 0's exposed communication; this names the rank and says how much of it is the
        // wait for the straggler).
        log::info(metrics.phases(done, phase_sum, phase_steps,
                                 trainer.work_spread(step_work, step_comm), rt.size()));
        phase_sum = {};
        phase_steps = 0;
        step_work.clear();
        step_comm.clear();
      }
    }
    if (cfg.eval.every_steps > 0 && done % cfg.eval.every_steps == 0 && done != last_step &&
        valid_store.num_samples() > 0) {
      const auto [loss, tokens] = trainer.evaluate(valid_store, cfg.eval.batches);
      log::info(metrics.eval(done, loss, tokens));
    }
    if (st.stop_ranks > 0) {
      // Every rank saw the same count in the step's all-reduce: all stop here together.
      const int mine = runtime::stop_signal();
      log::info("stop requested (" +
                (mine ? runtime::signal_name(mine) + " on this rank, " : std::string()) +
                std::to_string(st.stop_ranks) + " of " + std::to_string(rt.size()) +
                " ranks signalled) after step " + std::to_string(done) + ": saving a checkpoint");
      if (last_saved_step != done) save_checkpoint();
      log::info("stopped after step " + std::to_string(done) + " of " + std::to_string(max_steps) +
                " on request; checkpoint committed; exit code " + std::to_string(kExitPreempted) +
                " (requeue to resume)");
      exit_code = kExitPreempted;
      break;
    }
    if (cfg.checkpoint.every_steps > 0 && done % cfg.checkpoint.every_steps == 0 &&
        done != last_step)
      save_checkpoint();
  }
  if (exit_code == kExitPreempted) return exit_code;
  if (last_saved_step != trainer.steps_done() && trainer.steps_done() > first_step)
    save_checkpoint();

  // --- the end: validation, the bigram baseline, where things are
  const double total =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  const std::int64_t ran = std::max<std::int64_t>(0, last_step - first_step);
  std::string summary = "done: " + std::to_string(ran) + " steps in " + duration(total);
  if (last_step < max_steps)
    summary += " | stopped after step " + std::to_string(last_step) + " of " +
               std::to_string(max_steps) + " (training.stop_at_step; resume to continue)";
  char buf[160];
  std::snprintf(buf, sizeof buf, " | final train loss %.4f", last_loss);
  summary += buf;
  if (valid_store.num_samples() > 0) {
    const auto [loss, tokens] = trainer.evaluate(valid_store, cfg.eval.batches);
    log::info(metrics.eval(trainer.steps_done(), loss, tokens));
    std::string note;
    const std::optional<double> bigram = bigram_baseline(run_data, cfg, root, note);
    std::snprintf(buf, sizeof buf, " | val loss %.4f", loss);
    summary += buf;
    if (bigram) {
      std::snprintf(buf, sizeof buf, " | bigram baseline %.4f (%s)", *bigram,
                    loss < *bigram ? "beaten" : "NOT beaten");
      summary += buf;
    }
    summary += note;
  }
  if (root)
    train::write_parameters_h5((dir / "final-params.h5").string(), trainer.model().params(),
                               trainer.steps_done());
  if (trainer.skipped_steps() > 0)
    summary += " | " + std::to_string(trainer.skipped_steps()) + " steps skipped";
  log::info(summary);
  log::info("run directory: " + dir.string() + " (deck.yaml, " + cfg.logging.metrics_file +
            ", final-params.h5, checkpoints/)");
  return kExitOk;
}

}  // namespace dst::app
