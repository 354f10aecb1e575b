#pragma once
/// \file metrics.hpp
/// What a run reports: one fixed-format line per logged step on rank 0 (llm.c style) and
/// a JSON Lines file in the run directory: a header record (version, resolved deck) and
/// one record per logged step and evaluation. Only rank 0 writes.

#include <cstdint>
#include <fstream>
#include <string>

#include "train/trainer.hpp"

namespace dst::train {

/// Median single-thread SGEMM rate at 2048^3 in GFLOP/s: the CPU peak of one core in the
/// MFU definition (docs/performance.md). Takes about a second.
double measure_cpu_peak_gflops();

/// Peak resident memory of this process (VmHWM), bytes.
std::uint64_t peak_resident_bytes();

class MetricsLog {
 public:
  /// `path` empty or `writer` false: lines are still formatted but nothing is written.
  MetricsLog(const std::string& path, bool writer);

  /// The header record: dstrain version, git hash, world layout, the resolved deck.
  void header(const std::string& deck_yaml, int world_size, double peak_gflops_per_rank);
  /// One step record; returns the fixed-format line.
  std::string step(const StepStats& s, std::int64_t max_steps, double tokens_per_s, double mfu,
                   double eta_s, std::uint64_t peak_bytes, std::int64_t skipped_total);
  /// An evaluation record; returns its line.
  std::string eval(std::int64_t step, double loss, std::int64_t tokens);
  /// The per-phase timer record (seconds per step, this rank; averaged over `steps`),
  /// with how the ranks' work per step spread (Trainer::work_spread, over the same steps).
  /// The line names the slowest rank when there are several.
  std::string phases(std::int64_t step, const StepStats& sum, std::int64_t steps,
                     const Trainer::WorkSpread& spread, int world_size);
  /// Records that could not be written (a full disk, a quota: said once in the log,
  /// training goes on), in all.
  std::int64_t lost_records() const { return lost_total_; }

 private:
  void write(const std::string& json_line);
  std::string path_;
  std::ofstream out_;
  bool writer_;
  std::int64_t lost_ = 0;        // records lost since the last one written
  std::int64_t lost_total_ = 0;  // records lost in all
};

}  // namespace dst::train
