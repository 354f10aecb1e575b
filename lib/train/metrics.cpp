#include "train/metrics.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "blas/gemm.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/version.hpp"

namespace dst::train {

double measure_cpu_peak_gflops() {
  constexpr std::int64_t n = 2048;
  std::vector<float> a(static_cast<std::size_t>(n * n), 0.5f), b(a.size(), 0.25f), c(a.size());
  std::vector<double> rates;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    blas::gemm({}, blas::Trans::no, blas::Trans::no, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f,
               c.data(), n);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rates.push_back(2.0 * n * n * n / s / 1e9);
  }
  std::sort(rates.begin(), rates.end());
  return rates[1];
}

std::uint64_t peak_resident_bytes() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  unsigned long long kib = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "VmHWM: %llu kB", &kib) == 1) break;
  std::fclose(f);
  return kib * 1024ull;
}

MetricsLog::MetricsLog(const std::string& path, bool writer)
    : path_(path), writer_(writer && !path.empty()) {
  if (writer_) {
    out_.open(path, std::ios::app);
    if (!out_) throw Error("metrics: cannot open '" + path + "' for writing");
  }
}

void MetricsLog::write(const std::string& json_line) {
  if (!writer_) return;
  errno = 0;
  out_ << json_line << '\n';
  out_.flush();  // a killed run keeps every record written so far
  if (out_) {
    if (lost_ > 0)
      log::info("metrics: " + path_ + " is written again; " + std::to_string(lost_) +
                " records were lost");
    lost_ = 0;
    return;
  }
  // A full disk or a quota: training goes on (the checkpoint, not this file, is what a
  // restart needs), said once, and each later record is tried again.
  const int cause = errno;
  if (lost_ == 0)
    log::warn("metrics: writing " + path_ + " failed (" +
              (cause != 0 ? std::string(std::strerror(cause)) : std::string("stream error")) +
              "): its records are lost until it can be written again");
  ++lost_;
  ++lost_total_;
  out_.clear();
}

void MetricsLog::header(const std::string& deck_yaml, int world_size, double peak_gflops_per_rank) {
  nlohmann::json j;
  j["type"] = "header";
  j["format_version"] = 1;
  j["dstrain_version"] = core::version();
  j["git"] = core::git_hash();
  j["world_size"] = world_size;
  j["peak_gflops_per_rank"] = peak_gflops_per_rank;
  j["deck"] = deck_yaml;
  write(j.dump());
}

namespace {
std::string hms(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const long t = static_cast<long>(s + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  return buf;
}
}  // namespace

std::string MetricsLog::step(const StepStats& s, std::int64_t max_steps, double tokens_per_s,
                             double mfu, double eta_s, std::uint64_t peak_bytes,
                             std::int64_t skipped_total) {
  nlohmann::json j;
  j["type"] = "step";
  j["step"] = s.step + 1;
  j["loss"] = s.loss;
  j["lr"] = s.lr;
  j["grad_norm"] = s.grad_norm;
  j["tokens"] = s.tokens;
  j["tokens_per_s"] = tokens_per_s;
  j["mfu"] = mfu;
  j["step_ms"] = s.seconds * 1e3;
  j["peak_mem_bytes"] = peak_bytes;
  j["skipped"] = s.skipped;
  j["skipped_total"] = skipped_total;
  if (s.loss_scale > 0) j["loss_scale"] = s.loss_scale;  // fp16 only
  if (s.mtp) j["mtp_loss"] = s.mtp_loss;                 // multi-token prediction only
  if (!s.moe.empty()) {  // DeepSeekMoE: the balance loss and each MoE block's balance
    j["aux_loss"] = s.aux_loss;
    nlohmann::json blocks = nlohmann::json::array();
    for (const MoeBalance& m : s.moe)
      blocks.push_back({{"max_over_mean", m.max_over_mean},
                        {"busiest_fraction", m.busiest_fraction},
                        {"idle_experts", m.idle_experts},
                        {"bias_min", m.bias_min},
                        {"bias_max", m.bias_max}});
    j["moe"] = blocks;
    if (s.moe_capacity) {  // model.moe.capacity_factor
      j["moe_dropped_rows"] = s.moe_dropped;
      j["moe_dropped_fraction"] = s.moe_dropped_fraction;
    }
  }
  if (s.expert_rows_mean > 0.0) {  // expert parallelism
    j["alltoall_ms"] = s.t_alltoall * 1e3;
    j["alltoall_bytes"] = s.alltoall_bytes;
    j["expert_rows_max"] = s.expert_rows_max;
    j["expert_rows_mean"] = s.expert_rows_mean;
    j["expert_rows_max_over_mean"] = s.expert_rows_max / s.expert_rows_mean;
  }
  if (s.tensor_bytes > 0.0) {  // tensor parallelism
    j["tensor_allreduce_ms"] = s.t_tensor * 1e3;
    j["tensor_allreduce_bytes"] = s.tensor_bytes;
  }
  j["eta_s"] = eta_s;
  write(j.dump());
  char scale[48] = "";
  if (s.loss_scale > 0) std::snprintf(scale, sizeof scale, " | scale %g", s.loss_scale);
  char mtp[40] = "";
  if (s.mtp) std::snprintf(mtp, sizeof mtp, " | mtp %.4f", s.mtp_loss);
  char moe[112] = "";
  if (!s.moe.empty()) {  // the least balanced MoE block
    double worst = 0.0;
    for (const MoeBalance& m : s.moe)
      worst = std::max(worst, m.max_over_mean);
    if (s.moe_capacity)
      std::snprintf(moe, sizeof moe, " | aux %.3e | load max/mean %.2f | dropped %.0f (%.2f%%)",
                    s.aux_loss, worst, s.moe_dropped, 100.0 * s.moe_dropped_fraction);
    else
      std::snprintf(moe, sizeof moe, " | aux %.3e | load max/mean %.2f", s.aux_loss, worst);
  }
  char ep[96] = "";
  if (s.expert_rows_mean > 0.0)
    std::snprintf(ep, sizeof ep, " | all-to-all %.1f ms %.2f MB | rows/rank max/mean %.2f",
                  s.t_alltoall * 1e3, s.alltoall_bytes / 1e6,
                  s.expert_rows_max / s.expert_rows_mean);
  char line[320];
  std::snprintf(line, sizeof line,
                "step %6lld/%lld | loss %.4f | lr %.3e | norm %7.4f | %8.0f tok/s | MFU %5.1f%% "
                "| %7.1f ms | mem %6.0f MiB | ETA %s%s%s",
                static_cast<long long>(s.step + 1), static_cast<long long>(max_steps), s.loss, s.lr,
                s.grad_norm, tokens_per_s, 100.0 * mfu, s.seconds * 1e3,
                static_cast<double>(peak_bytes) / 1048576.0, hms(eta_s).c_str(), scale,
                s.overflow  ? " | SKIPPED (fp16 overflow, loss scale halved)"
                : s.skipped ? " | SKIPPED (non-finite gradients)"
                            : "");
  return std::string(line) + mtp + moe + ep;
}

std::string MetricsLog::eval(std::int64_t step, double loss, std::int64_t tokens) {
  nlohmann::json j;
  j["type"] = "eval";
  j["step"] = step;
  j["val_loss"] = loss;
  j["val_ppl"] = std::exp(loss);
  j["val_tokens"] = tokens;
  write(j.dump());
  char line[160];
  std::snprintf(line, sizeof line, "eval step %lld | val loss %.4f | val ppl %.2f | %lld tokens",
                static_cast<long long>(step), loss, std::exp(loss), static_cast<long long>(tokens));
  return line;
}

std::string MetricsLog::phases(std::int64_t step, const StepStats& sum, std::int64_t steps,
                               const Trainer::WorkSpread& spread, int world_size) {
  const double n = steps > 0 ? static_cast<double>(steps) : 1.0;
  nlohmann::json j;
  j["type"] = "phases";
  j["step"] = step;
  j["data_ms"] = sum.t_data / n * 1e3;
  j["forward_ms"] = sum.t_forward / n * 1e3;
  j["backward_ms"] = sum.t_backward / n * 1e3;
  j["comm_exposed_ms"] = sum.t_comm / n * 1e3;
  j["optimizer_ms"] = sum.t_optimizer / n * 1e3;
  if (sum.alltoall_bytes > 0.0) {  // expert parallelism: inside forward and backward
    j["alltoall_ms"] = sum.t_alltoall / n * 1e3;
    j["alltoall_bytes"] = sum.alltoall_bytes / n;
  }
  if (sum.tensor_bytes > 0.0) {  // tensor parallelism: inside forward and backward
    j["tensor_allreduce_ms"] = sum.t_tensor / n * 1e3;
    j["tensor_allreduce_bytes"] = sum.tensor_bytes / n;
  }
  j["step_ms"] = sum.seconds / n * 1e3;
  j["work_ms_min"] = spread.min_s * 1e3;
  j["work_ms_max"] = spread.max_s * 1e3;
  j["slowest_rank"] = spread.slowest_rank;
  j["straggle_ms"] = spread.per_step.straggle_s * 1e3;
  j["comm_peer_wait_ms"] = spread.per_step.peer_wait_s * 1e3;
  write(j.dump());
  char waited[80] = "";
  char across[160] = "";
  if (world_size > 1) {
    std::snprintf(waited, sizeof waited, " (%.1f of it waiting for slower ranks)",
                  spread.per_step.peer_wait_s * 1e3);
    std::snprintf(across, sizeof across,
                  " | work (data+forward+backward) across %d ranks %.1f-%.1f, slowest rank %d, "
                  "%.1f apart step by step",
                  world_size, spread.min_s * 1e3, spread.max_s * 1e3, spread.slowest_rank,
                  spread.per_step.straggle_s * 1e3);
  }
  char ep[160] = "";
  if (sum.alltoall_bytes > 0.0)
    std::snprintf(ep, sizeof ep, " | expert all-to-all %.1f (in forward+backward)",
                  sum.t_alltoall / n * 1e3);
  if (sum.tensor_bytes > 0.0)
    std::snprintf(ep + std::strlen(ep), sizeof ep - std::strlen(ep),
                  " | tensor all-reduce %.1f (in forward+backward)", sum.t_tensor / n * 1e3);
  char line[480];
  std::snprintf(line, sizeof line,
                "phases (ms/step, rank 0, last %lld steps): data %.1f | forward %.1f | backward "
                "%.1f | exposed comm %.1f%s | optimizer %.1f | step %.1f%s",
                static_cast<long long>(steps), sum.t_data / n * 1e3, sum.t_forward / n * 1e3,
                sum.t_backward / n * 1e3, sum.t_comm / n * 1e3, waited, sum.t_optimizer / n * 1e3,
                sum.seconds / n * 1e3, across);
  return std::string(line) + ep;
}

}  // namespace dst::train
