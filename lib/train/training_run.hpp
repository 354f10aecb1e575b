#pragma once
/// \file training_run.hpp
/// One training run, start to end (`dstrain train`): made from the runtime and the
/// resolved deck, it owns everything the run uses - the data (train_data.hpp) and its one
/// sampler (through the trainer's data::BatchSource), the trainer with its communicators and
/// shared buffers, the checkpoint directory, the metrics log - and the cadence of the
/// loop: logging, evaluation, checkpoints, stop requests, fault injection (faults.hpp).
/// docs/architecture.md follows one optimizer step through it.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/checkpoint.hpp"
#include "comm/process_groups.hpp"
#include "config/run_config.hpp"
#include "runtime/runtime.hpp"
#include "train/metrics.hpp"
#include "train/train_data.hpp"
#include "train/trainer.hpp"

namespace dst::train {

class TrainingRun {
 public:
  /// Sets the run up (collective over `groups`): opens the data, builds the trainer on
  /// the resolved back ends, writes the resolved deck into run.output_dir, resumes from a
  /// checkpoint (checkpoint.resume) or draws the initial weights, measures the peak for
  /// the MFU and logs the start-up table. Errors end the job as CollectiveError or
  /// JobFailed with the exit codes of docs/exit-codes.md.
  TrainingRun(runtime::Runtime& rt, const config::RunConfig& config, const config::Layout& layout,
              const runtime::Backends& backends, comm::ProcessGroups& groups);
  ~TrainingRun();
  TrainingRun(const TrainingRun&) = delete;
  TrainingRun& operator=(const TrainingRun&) = delete;

  /// Trains to training.max_steps (or training.stop_at_step), then evaluates, saves the
  /// final checkpoint and parameters and logs the summary. Returns the exit code:
  /// kExitOk, or kExitPreempted after a stop signal (a checkpoint was committed).
  int run();

 private:
  /// The cadence of one finished step: metrics line, phases record, consistency check,
  /// evaluation. `done`: steps completed.
  void after_step(const StepStats& st, std::int64_t done);
  /// Saves a checkpoint of the state after trainer_->steps_done() steps (collective).
  void save_checkpoint();
  /// Logs the start-up table: model, data, steps, peak, precision, directories.
  void log_start() const;
  /// Validation, the bigram baseline, the final parameters, the summary line.
  void finish(double seconds);

  runtime::Runtime& rt_;
  const config::RunConfig& cfg_;
  config::Layout layout_;
  bool root_;
  bool on_gpu_;
  std::string host_products_;  ///< how the host's products run (log)
  TrainData data_;
  std::unique_ptr<Trainer> trainer_;
  std::string deck_yaml_;
  std::unique_ptr<ckpt::Directory> checkpoints_;
  std::unique_ptr<MetricsLog> metrics_;
  std::int64_t first_step_ = 0;  ///< steps done when this process started
  std::int64_t last_step_ = 0;   ///< the step this process stops after
  double peak_gflops_ = 0.0;     ///< per rank, for the MFU (0: not reported)
  double flops_per_token_ = 0.0;
  // checkpoints written
  bool have_checkpoint_ = false;
  bool saved_this_run_ = false;
  std::int64_t last_saved_step_ = -1;
  // what the next metrics line and phases record summarise
  std::int64_t tokens_since_ = 0;
  double seconds_since_ = 0.0;
  StepStats phase_sum_;
  std::int64_t phase_steps_ = 0;
  /// This rank's work (data + forward + backward) and exposed communication of each step
  /// since the last phases record (Trainer::work_spread compares them across the ranks).
  std::vector<double> step_work_, step_comm_;
  double run_start_ = 0.0;  ///< steady-clock seconds when the loop started
  double last_loss_ = 0.0;
};

}  // namespace dst::train
