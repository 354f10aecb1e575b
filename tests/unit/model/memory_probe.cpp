// Measures the memory a real forward + backward takes and compares it with what the
// layout pass (the planning mode `dstrain check` uses) says: parameters, gradients,
// activations and workspace of one micro-batch. Exits non-zero if they differ by more
// than 10%. Measured = peak resident set (VmHWM) during the step minus the resident set
// before the model existed; OpenBLAS's own buffers are created by a warm-up product
// before the baseline, since they are not the model's.
// usage: memory_probe PRESET MICRO_BATCH
#include <Kokkos_Core.hpp>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "blas/gemm.hpp"
#include "config/deck.hpp"
#include "core/rng.hpp"
#include "model/dense_model.hpp"
#include "model/plan.hpp"

namespace {
long status_kib(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string k;
  long v = 0;
  std::string unit;
  while (in >> k) {
    if (k == key) {
      in >> v >> unit;
      return v;
    }
    std::getline(in, unit);
  }
  return -1;
}
}  // namespace

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  if (argc != 3) {
    std::fprintf(stderr, "usage: memory_probe PRESET MICRO_BATCH\n");
    return 2;
  }
  const auto cfg = dst::config::load_deck_text(std::string("model: {preset: ") + argv[1] +
                                                   "}\ntraining: {micro_batch_size: " + argv[2] +
                                                   ", global_batch_size: " + argv[2] + "}\n",
                                               "memory_probe");
  const std::int64_t B = cfg.training.micro_batch_size, T = cfg.data.seq_len;
  {  // warm-up: OpenBLAS allocates its work buffers on first use
    std::vector<float> a(512 * 512, 1.0f), c(a.size());
    dst::blas::gemm({}, dst::blas::Trans::no, dst::blas::Trans::no, 512, 512, 512, 1.0f, a.data(),
                    512, a.data(), 512, 0.0f, c.data(), 512);
  }
  const dst::model::DenseModel planned(cfg.model, B, T, dst::tensor::Arena::Mode::plan);
  const auto pm = planned.memory();
  const double plan_mib =
      static_cast<double>(pm.parameters + pm.gradients + pm.activations + pm.workspace) / 1048576.0;

  const long base_kib = status_kib("VmRSS:");
  dst::model::DenseModel model(cfg.model, B, T, dst::tensor::Arena::Mode::allocate);
  model.params().initialize(1);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(B * T)), targets(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<std::int32_t>(dst::core::uniform01(1, 1, i) *
                                          static_cast<float>(cfg.model.vocab_size));
    targets[i] = static_cast<std::int32_t>(dst::core::uniform01(1, 2, i) *
                                           static_cast<float>(cfg.model.vocab_size));
  }
  model.forward_backward(tokens.data(), targets.data(), 1.0f / static_cast<float>(tokens.size()));
  const long peak_kib = status_kib("VmHWM:");
  const double measured_mib = static_cast<double>(peak_kib - base_kib) / 1024.0;
  const double ratio = measured_mib / plan_mib;
  std::printf(
      "memory_probe %s micro-batch %lld: planned %.1f MiB, measured %.1f MiB (ratio %.3f)\n",
      argv[1], static_cast<long long>(B), plan_mib, measured_mib, ratio);
  return ratio > 0.9 && ratio < 1.1 ? 0 : 1;
}
