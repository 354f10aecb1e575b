#include "train/moe_balancer.hpp"

#include <algorithm>
#include <numeric>
#include <string>

#include "core/error.hpp"
#include "core/log.hpp"
#include "model/stage.hpp"

namespace dst::train {

MoeBalancer::MoeBalancer(const config::RunConfig& config, const config::Layout& layout,
                         comm::ProcessGroups& groups)
    : groups_(groups),
      global_batch_(layout.global_batch_size),
      seq_len_(config.data.seq_len),
      experts_(config.model.n_routed_experts),
      top_k_(config.model.num_experts_per_tok),
      capacity_(config.model.moe.capacity_factor > 0.0),
      stage_(groups.pipeline_rank),
      stages_(static_cast<int>(layout.pipeline)) {
  // The MTP module's block (layer n_layers) comes after the model's, with the head.
  const std::int64_t L = config.model.n_layers + (config.model.mtp_depth > 0 ? 1 : 0);
  std::vector<std::int64_t> moe_layers;
  for (std::int64_t l = 0; l < L; ++l)
    if (config.model.moe_layer(l)) moe_layers.push_back(l);
  if (stages_ == 1) {
    stage_blocks_.push_back(moe_layers.size());
  } else {
    // Each stage's MoE blocks in its own order (its chunks in turn), and where each stands
    // among the model's MoE blocks (the interleaved schedule's chunks are not in the
    // model's order); this rank's MoE blocks before each of its chunks.
    for (int s = 0; s < stages_; ++s) {
      std::size_t n = 0;
      for (const model::StageBlocks& b : model::rank_chunks(config, s, 0)) {
        if (s == stage_) chunk_offset_.push_back(n);
        for (std::int64_t l = b.first; l < (b.head ? L : b.last); ++l) {
          if (!config.model.moe_layer(l)) continue;
          ++n;
          order_.push_back(static_cast<std::size_t>(
              std::lower_bound(moe_layers.begin(), moe_layers.end(), l) - moe_layers.begin()));
        }
      }
      stage_blocks_.push_back(n);
    }
  }
  active_ = std::accumulate(stage_blocks_.begin(), stage_blocks_.end(), std::size_t{0}) > 0;
}

void MoeBalancer::begin_step(std::int64_t micro_batches) {
  micro_batches_ = micro_batches;
  terms_.assign(static_cast<std::size_t>(micro_batches) * own_blocks(), 0.0);
}

void MoeBalancer::keep_terms(std::int64_t micro, int chunk, const std::vector<double>& terms) {
  const std::size_t at = static_cast<std::size_t>(micro) * own_blocks() +
                         chunk_offset_.at(static_cast<std::size_t>(chunk));
  if (at + terms.size() > terms_.size())
    throw Error("MoE balancer: " + std::to_string(terms.size()) + " balance-loss terms of chunk " +
                std::to_string(chunk) + ", micro-batch " + std::to_string(micro) +
                " do not fit the step's " + std::to_string(terms_.size()));
  std::copy(terms.begin(), terms.end(), terms_.begin() + static_cast<std::ptrdiff_t>(at));
}

MoeBalancer::Sums MoeBalancer::reduce(std::vector<double> loads, double dropped,
                                      double aux_sum) const {
  if (stages_ > 1) {
    // Every stage's terms (one all-gather over the pipeline group), added as a one-stage
    // run adds them: per micro-batch the blocks' in the model's order from 0, then that sum.
    const auto micro_batches = static_cast<std::size_t>(micro_batches_);
    std::vector<std::size_t> counts, starts;
    std::size_t total = 0;
    for (const std::size_t n : stage_blocks_) {
      starts.push_back(total);
      counts.push_back(micro_batches * n);
      total += counts.back();
    }
    std::vector<double> all(total, 0.0);
    std::copy(terms_.begin(), terms_.end(),
              all.begin() + static_cast<std::ptrdiff_t>(starts[static_cast<std::size_t>(stage_)]));
    groups_.pipeline->iallgather_blocks(all.data(), counts, DType::f64).wait();
    aux_sum = 0.0;
    std::vector<double> terms(order_.size());
    for (std::size_t mb = 0; mb < micro_batches; ++mb) {
      std::size_t j = 0;  // the stages' blocks in turn, each put at its place in the model
      for (std::size_t s = 0; s < stage_blocks_.size(); ++s)
        for (std::size_t b = 0; b < stage_blocks_[s]; ++b)
          terms[order_[j++]] = all[starts[s] + mb * stage_blocks_[s] + b];
      double sum = 0.0;
      for (const double t : terms)
        sum += t;
      aux_sum += sum;
    }
  }
  // Loads of every MoE block and this rank's balance loss, summed over the data group:
  // every rank then moves the biases alike (counts are exact in double).
  loads.push_back(dropped);  // the capacity's dropped rows
  loads.push_back(aux_sum);
  groups_.data->allreduce(loads.data(), loads.size(), DType::f64, comm::ReduceOp::sum);
  Sums out;
  out.aux = loads.back();
  loads.pop_back();
  out.dropped = loads.back();
  loads.pop_back();
  out.loads = std::move(loads);
  return out;
}

void MoeBalancer::report(const Sums& sums, std::vector<float> bias, StepStats& st,
                         std::int64_t step) {
  st.aux_loss = sums.aux / static_cast<double>(global_batch_);
  st.moe_dropped = sums.dropped;
  std::vector<double> loads = sums.loads;
  const std::int64_t E = experts_;
  std::int64_t blocks = static_cast<std::int64_t>(own_blocks());
  if (stages_ > 1) {
    // The metrics cover the whole model: every stage's loads and biases in block order
    // (all-gathers over the pipeline group), the dropped rows summed (exact counts).
    std::vector<std::size_t> counts;
    std::size_t at = 0, total = 0;
    for (std::size_t s = 0; s < stage_blocks_.size(); ++s) {
      counts.push_back(stage_blocks_[s] * static_cast<std::size_t>(E));
      if (static_cast<int>(s) < stage_) at += counts.back();
      total += counts.back();
    }
    std::vector<double> stage_loads(total, 0.0);
    std::vector<float> biases(total, 0.0f);
    std::copy(loads.begin(), loads.end(), stage_loads.begin() + static_cast<std::ptrdiff_t>(at));
    std::copy(bias.begin(), bias.end(), biases.begin() + static_cast<std::ptrdiff_t>(at));
    groups_.pipeline->iallgather_blocks(stage_loads.data(), counts, DType::f64).wait();
    groups_.pipeline->iallgather_blocks(biases.data(), counts, DType::f32).wait();
    groups_.pipeline->allreduce(&st.moe_dropped, 1, DType::f64, comm::ReduceOp::sum);
    // In the model's block order (the stages' in turn under 1F1B, not with chunks).
    loads.assign(total, 0.0);
    bias.assign(total, 0.0f);
    const auto e = static_cast<std::size_t>(E);
    for (std::size_t j = 0; j < order_.size(); ++j)
      for (std::size_t x = 0; x < e; ++x) {
        loads[order_[j] * e + x] = stage_loads[j * e + x];
        bias[order_[j] * e + x] = biases[j * e + x];
      }
    blocks = static_cast<std::int64_t>(total) / E;
  }
  idle_steps_.resize(loads.size(), 0);
  // Tokens that reach the MoE blocks: each routes to num_experts_per_tok experts.
  const double tokens = static_cast<double>(global_batch_) * static_cast<double>(seq_len_);
  st.moe_capacity = capacity_;
  st.moe_dropped_fraction = st.moe_dropped / (tokens * static_cast<double>(top_k_ * blocks));
  // DeepSeek-V3's "no token dropping" assumes every expert keeps receiving tokens; an
  // expert idle for this many steps in a row is worth a warning (once, as it crosses).
  constexpr std::int64_t kIdleWarnSteps = 100;
  st.moe.assign(static_cast<std::size_t>(blocks), MoeBalance{});
  for (std::int64_t b = 0; b < blocks; ++b) {
    MoeBalance& m = st.moe[static_cast<std::size_t>(b)];
    const auto first = static_cast<std::size_t>(b * E);
    double total = 0.0, busiest = 0.0;
    m.bias_min = m.bias_max = bias[first];
    for (std::int64_t e = 0; e < E; ++e) {
      const std::size_t i = first + static_cast<std::size_t>(e);
      total += loads[i];
      busiest = std::max(busiest, loads[i]);
      m.bias_min = std::min(m.bias_min, static_cast<double>(bias[i]));
      m.bias_max = std::max(m.bias_max, static_cast<double>(bias[i]));
      if (loads[i] > 0.0) {
        idle_steps_[i] = 0;
        continue;
      }
      ++m.idle_experts;
      if (++idle_steps_[i] == kIdleWarnSteps && groups_.world->rank() == 0)
        log::warn("MoE block " + std::to_string(b) + " expert " + std::to_string(e) +
                  " has received no token for " + std::to_string(kIdleWarnSteps) + " steps (step " +
                  std::to_string(step + 1) + ")");
    }
    m.max_over_mean = total > 0.0 ? busiest / (total / static_cast<double>(E)) : 0.0;
    m.busiest_fraction = tokens > 0.0 ? busiest / tokens : 0.0;
  }
}

}  // namespace dst::train
