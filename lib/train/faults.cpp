#include "train/faults.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <thread>

#include "core/exit_codes.hpp"
#include "core/flight_recorder.hpp"
#include "core/log.hpp"

namespace dst::train {

Faults::Faults(const config::DebugSection& debug, int rank, int world_size)
    : debug_(debug), rank_(rank), world_size_(world_size) {}

void Faults::before_step(std::int64_t step, bool saved_this_run) const {
  if (!saved_this_run) return;
  if (debug_.inject_exit_rank == rank_) {
    log::warn("debug.inject_exit_rank: exiting at step " + std::to_string(step));
    std::fflush(nullptr);
    std::_Exit(kExitInjected);
  }
  if (debug_.inject_hang_rank == rank_) {
    log::warn("debug.inject_hang_rank: hanging at step " + std::to_string(step));
    core::FlightScope hang("debug.inject_hang_rank: a deliberate hang");
    for (;;)
      std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

void Faults::straggle() const {
  if (debug_.inject_straggler_rank == rank_ && debug_.inject_straggler_ms > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(debug_.inject_straggler_ms));
}

std::optional<float> Faults::gradient_poison(std::int64_t step) const {
  if (rank_ != world_size_ - 1) return std::nullopt;
  if (debug_.inject_nan_step == step) return std::numeric_limits<float>::quiet_NaN();
  if (debug_.inject_overflow_step == step) return std::numeric_limits<float>::infinity();
  return std::nullopt;
}

bool Faults::diverges_after(std::int64_t step) const {
  return debug_.inject_divergence_rank == rank_ && step == 0;
}

int Faults::checkpoint_exit_rank(bool have_checkpoint) const {
  return debug_.inject_exit_in_checkpoint && have_checkpoint ? world_size_ - 1 : -1;
}

std::size_t Faults::poison_offset(const config::ModelSection& model, const model::ParamStore& store,
                                  std::int64_t last_block, std::int64_t first_expert) {
  const std::string poisoned =
      model.moe_layer(last_block)
          ? ".mlp.experts." + std::to_string(first_expert) + ".down_proj.weight"
          : ".mlp.down_proj.weight";
  return store.spec(store.index_of("model.layers." + std::to_string(last_block) + poisoned)).offset;
}

}  // namespace dst::train
