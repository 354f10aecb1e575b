// adamw_dump OUTDIR: a few AdamW steps of train::AdamW (and so of kernels::adamw_step)
// for tests/oracle/adamw_parity.py, which repeats them with torch.optim.AdamW.
//
// For each case, OUTDIR/<case>/ holds raw little-endian f32 files, tensors concatenated in
// store order without padding: params_0.f32 (initial), and for each step t = 1..T
// grads_t.f32 (the gradients before grad_scale), params_t.f32, m_t.f32, v_t.f32 (after
// the step); and meta.txt, one "key value..." per line:
//   tensor NAME NUMEL DECAY(0|1)       (one per tensor, in order)
//   hyper BETA1 BETA2 EPS WEIGHT_DECAY (%.17g: the exact doubles)
//   step T LR GRAD_SCALE               (one per step)
// OUTDIR/cases.txt lists the case directories.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "model/param_store.hpp"
#include "train/optimizer.hpp"
#include "train/schedule.hpp"

namespace {

using dst::model::ParamSpec;
using dst::model::ParamStore;

struct Case {
  std::string name;
  double beta1, beta2, eps, weight_decay;
  int steps;
  bool loss_scaled;  ///< grad_scale = 1/1024 x a clip factor, with gradients 1024x larger
  float grad_magnitude;
};

void write_f32(const std::filesystem::path& path, const std::vector<float>& v) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(v.data()),
            static_cast<std::streamsize>(v.size() * sizeof(float)));
  if (!out) throw dst::Error("adamw_dump: cannot write " + path.string());
}

/// Tensors of `store` concatenated, padding left out.
std::vector<float> gather(const ParamStore& store, const float* base) {
  std::vector<float> out;
  for (const auto& s : store.specs())
    out.insert(out.end(), base + s.offset, base + s.offset + s.shape.numel());
  return out;
}

void run_case(const Case& c, const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  std::vector<ParamSpec> specs{{"layer.weight", {31, 17}, dst::model::Init::normal, 0.5f, true, 0},
                               {"layer.norm", {17}, dst::model::Init::ones, 0.0f, false, 0},
                               {"head.weight", {5, 17}, dst::model::Init::normal, 0.5f, true, 0}};
  ParamStore store(specs, dst::tensor::Arena::Mode::allocate);
  store.initialize(7);
  dst::config::TrainingSection training;
  training.max_steps = c.steps;
  training.optimizer.lr = 1e-2;
  training.optimizer.betas = {c.beta1, c.beta2};
  training.optimizer.eps = c.eps;
  training.optimizer.weight_decay = c.weight_decay;
  training.schedule.type = dst::config::ScheduleType::cosine;
  training.schedule.warmup_steps = 2;
  dst::train::AdamW adamw(training.optimizer, store);
  const dst::tensor::ExecContext ctx{dst::tensor::Backend::kokkos, nullptr};

  std::ofstream meta(dir / "meta.txt");
  for (const auto& s : store.specs())
    meta << "tensor " << s.name << " " << s.shape.numel() << " " << (s.weight_decay ? 1 : 0)
         << "\n";
  char line[256];
  std::snprintf(line, sizeof line, "hyper %.17g %.17g %.17g %.17g\n", c.beta1, c.beta2, c.eps,
                c.weight_decay);
  meta << line;
  write_f32(dir / "params_0.f32", gather(store, store.params_data()));

  std::mt19937 gen(1234);
  std::normal_distribution<float> normal(0.0f, c.grad_magnitude);
  for (int t = 1; t <= c.steps; ++t) {
    store.zero_grads();
    for (std::size_t i = 0; i < store.size(); ++i) {
      float* g = store.grad(i).ptr<float>();
      for (std::int64_t j = 0; j < store.spec(i).shape.numel(); ++j)
        g[j] = (j % 13 == 4) ? 0.0f : normal(gen);  // some exact zeros
    }
    const double lr = dst::train::learning_rate(training, t - 1, 1);
    // A loss scale of 1024 removed, times a clip factor as the trainer would pass it.
    const double grad_scale = c.loss_scaled ? (1.0 / 1024.0) * 0.75 : 1.0;
    adamw.step(ctx, store, lr, grad_scale);
    std::snprintf(line, sizeof line, "step %d %.17g %.17g\n", t, lr, grad_scale);
    meta << line;
    const std::string suffix = "_" + std::to_string(t) + ".f32";
    write_f32(dir / ("grads" + suffix), gather(store, store.grads_data()));
    write_f32(dir / ("params" + suffix), gather(store, store.params_data()));
    write_f32(dir / ("m" + suffix), gather(store, adamw.state().m));
    write_f32(dir / ("v" + suffix), gather(store, adamw.state().v));
  }
  if (!meta) throw dst::Error("adamw_dump: cannot write " + (dir / "meta.txt").string());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: adamw_dump OUTDIR\n";
    return 2;
  }
  Kokkos::ScopeGuard kokkos(argc, argv);
  try {
    const std::filesystem::path out = argv[1];
    std::filesystem::create_directories(out);
    const std::vector<Case> cases{
        // DeepSeek-LLM's hyper-parameters (betas 0.9/0.95, weight decay 0.1).
        {"deepseek", 0.9, 0.95, 1e-8, 0.1, 8, false, 1.0f},
        // PyTorch's defaults, gradients loss-scaled by 1024 and clipped via grad_scale.
        {"torch_defaults_scaled", 0.9, 0.999, 1e-8, 1e-2, 6, true, 1024.0f},
        // Gradients near eps: where eps's place in the formula decides the update.
        {"tiny_grads", 0.9, 0.95, 1e-8, 0.1, 5, false, 1e-8f},
    };
    std::ofstream list(out / "cases.txt");
    for (const auto& c : cases) {
      run_case(c, out / c.name);
      list << c.name << "\n";
    }
    std::cout << "adamw_dump: wrote " << cases.size() << " cases to " << out.string() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "adamw_dump: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
