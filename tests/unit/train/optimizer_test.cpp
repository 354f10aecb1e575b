// train::AdamW over a ParamStore: every tensor stepped with the right hyper-parameters
// (no decay for norm weights), the step count, the moment layout, the state for
// checkpoints; against a double reference of torch.optim.AdamW.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "model/param_store.hpp"
#include "train/optimizer.hpp"

namespace dst::train {
namespace {

using model::ParamSpec;
using model::ParamStore;
using tensor::Arena;
using tensor::ExecContext;

ExecContext ctx() {
  return ExecContext{tensor::Backend::kokkos, nullptr};
}

/// Three tensors of sizes that leave padding between them (offsets are 16-float aligned),
/// the middle one a norm weight (no decay).
std::vector<ParamSpec> specs() {
  return {ParamSpec{"w", {3, 5}, model::Init::normal, 0.02f, true, 0},
          ParamSpec{"norm", {5}, model::Init::ones, 0.0f, false, 0},
          ParamSpec{"b", {17}, model::Init::normal, 0.02f, true, 0}};
}

config::OptimizerSection optimizer_section() {
  config::OptimizerSection o;
  o.betas = {0.9, 0.95};
  o.eps = 1e-8;
  o.weight_decay = 0.1;
  return o;
}

void fill(float* p, std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (std::size_t i = 0; i < n; ++i)
    p[i] = d(gen);
}

/// torch.optim.AdamW in double for one tensor.
struct Reference {
  std::vector<double> p, m, v;
  void step(const float* g, double lr, double wd, double b1, double b2, double eps, std::int64_t t,
            double grad_scale) {
    const double bias1 = 1 - std::pow(b1, static_cast<double>(t));
    const double bias2 = 1 - std::pow(b2, static_cast<double>(t));
    for (std::size_t i = 0; i < p.size(); ++i) {
      const double gi = g[i] * static_cast<float>(grad_scale);
      p[i] *= 1 - lr * wd;
      m[i] = b1 * m[i] + (1 - b1) * gi;
      v[i] = b2 * v[i] + (1 - b2) * gi * gi;
      p[i] -= lr * (m[i] / bias1) / (std::sqrt(v[i] / bias2) + eps);
    }
  }
};

TEST(AdamWOptimizer, StepsEveryTensorLikePyTorchWithNoDecayForNorms) {
  ParamStore store(specs(), Arena::Mode::allocate);
  fill(store.params_data(), store.buffer_elements(), 1);
  const auto opt = optimizer_section();
  AdamW adamw(opt, store);
  EXPECT_EQ(adamw.step_count(), 0);

  std::vector<Reference> ref(store.size());
  for (std::size_t i = 0; i < store.size(); ++i) {
    const float* p = store.param(i).ptr<float>();
    const auto n = static_cast<std::size_t>(store.spec(i).shape.numel());
    ref[i].p.assign(p, p + n);
    ref[i].m.assign(n, 0.0);
    ref[i].v.assign(n, 0.0);
  }
  const int steps = 5;
  for (int t = 1; t <= steps; ++t) {
    store.zero_grads();
    for (std::size_t i = 0; i < store.size(); ++i)
      fill(store.grad(i).ptr<float>(), static_cast<std::size_t>(store.spec(i).shape.numel()),
           10u * static_cast<std::uint32_t>(t) + static_cast<std::uint32_t>(i));
    const double lr = 1e-2 / t;
    adamw.step(ctx(), store, lr, 0.5);
    EXPECT_EQ(adamw.step_count(), t);
    for (std::size_t i = 0; i < store.size(); ++i)
      ref[i].step(store.grad(i).ptr<float>(), lr, store.spec(i).weight_decay ? 0.1 : 0.0, 0.9, 0.95,
                  1e-8, t, 0.5);
  }
  // As kernels_tests' AdamW bound: per step 2 roundings of |p| <= 2 and 16 ulps of an
  // update <= 4 lr (lr <= 1e-2).
  const double tol = steps * 0x1p-24 * (2 * 2.0 + 16 * 4 * 1e-2);
  for (std::size_t i = 0; i < store.size(); ++i) {
    const float* p = store.param(i).ptr<float>();
    for (std::size_t j = 0; j < ref[i].p.size(); ++j)
      EXPECT_NEAR(p[j], ref[i].p[j], tol) << store.spec(i).name << "[" << j << "]";
  }
  // The same reference with decay on the norm weight ends ~sum(lr) * wd = 2.3e-3 away
  // from it (|p| ~ 1): far outside the tolerance, so a decayed norm would fail above.
  const auto norm = store.index_of("norm");
  double max_gap = 0;
  for (std::size_t j = 0; j < 5; ++j) {
    double p = ref[norm].p[j], p_decayed = p;
    for (int t = 1; t <= steps; ++t)
      p_decayed *= 1.0 - 1e-2 / t * 0.1;
    max_gap = std::max(max_gap, std::fabs(p - p_decayed));
  }
  EXPECT_GT(max_gap, 100 * tol);
}

TEST(AdamWOptimizer, MomentsShareTheStoreLayoutAndPaddingStaysZero) {
  ParamStore store(specs(), Arena::Mode::allocate);
  fill(store.params_data(), store.buffer_elements(), 2);
  fill(store.grads_data(), store.buffer_elements(), 3);  // padding gradients too: ignored
  AdamW adamw(optimizer_section(), store);
  adamw.step(ctx(), store, 1e-3);
  const AdamWState s = adamw.state();
  EXPECT_EQ(s.elements, store.buffer_elements());
  EXPECT_EQ(s.step, 1);
  EXPECT_EQ(adamw.bytes(), 2 * store.buffer_elements() * sizeof(float));
  std::vector<bool> inside(s.elements, false);
  for (std::size_t i = 0; i < store.size(); ++i) {
    EXPECT_EQ(adamw.m(i).data, s.m + store.spec(i).offset);
    EXPECT_EQ(adamw.v(i).data, s.v + store.spec(i).offset);
    EXPECT_EQ(adamw.m(i).shape, store.spec(i).shape);
    // At step 1 m = (1 - beta1) g exactly as computed in float.
    const float* g = store.grad(i).ptr<float>();
    const float* m = adamw.m(i).ptr<float>();
    for (std::int64_t j = 0; j < store.spec(i).shape.numel(); ++j) {
      inside[store.spec(i).offset + static_cast<std::size_t>(j)] = true;
      EXPECT_NEAR(m[j], 0.1 * g[j], 2 * 0x1p-24 * std::fabs(g[j]));
    }
  }
  for (std::size_t k = 0; k < s.elements; ++k)
    if (!inside[k]) {
      EXPECT_EQ(s.m[k], 0.0f) << "padding m[" << k << "]";
      EXPECT_EQ(s.v[k], 0.0f) << "padding v[" << k << "]";
    }
}

TEST(AdamWOptimizer, RestoredStateContinuesBitForBit) {
  // A run of 3 steps against 2 steps, a "checkpoint" (moments, parameters, step count)
  // copied into a fresh optimizer and store, and the third step there: the same bits.
  const auto opt = optimizer_section();
  ParamStore a(specs(), Arena::Mode::allocate);
  fill(a.params_data(), a.buffer_elements(), 4);
  AdamW adamw_a(opt, a);
  auto grads_for = [](ParamStore& s, int t) {
    fill(s.grads_data(), s.buffer_elements(), 100u + static_cast<std::uint32_t>(t));
  };
  for (int t = 1; t <= 2; ++t) {
    grads_for(a, t);
    adamw_a.step(ctx(), a, 1e-3 * t);
  }
  ParamStore b(specs(), Arena::Mode::allocate);
  AdamW adamw_b(opt, b);
  const std::size_t bytes = a.buffer_elements() * sizeof(float);
  std::memcpy(b.params_data(), a.params_data(), bytes);
  std::memcpy(adamw_b.state().m, adamw_a.state().m, bytes);
  std::memcpy(adamw_b.state().v, adamw_a.state().v, bytes);
  adamw_b.set_step_count(adamw_a.state().step);
  grads_for(a, 3);
  grads_for(b, 3);
  adamw_a.step(ctx(), a, 3e-3);
  adamw_b.step(ctx(), b, 3e-3);
  EXPECT_EQ(std::memcmp(a.params_data(), b.params_data(), bytes), 0);
  EXPECT_EQ(std::memcmp(adamw_a.state().v, adamw_b.state().v, bytes), 0);
  EXPECT_EQ(adamw_b.step_count(), 3);

  // A restore that forgot the step count would bias-correct as step 1: different bits.
  ParamStore c(specs(), Arena::Mode::allocate);
  AdamW adamw_c(opt, c);
  std::memcpy(c.params_data(), b.params_data(), bytes);
  std::memcpy(adamw_c.state().m, adamw_b.state().m, bytes);
  std::memcpy(adamw_c.state().v, adamw_b.state().v, bytes);
  grads_for(b, 4);
  grads_for(c, 4);
  adamw_b.step(ctx(), b, 1e-3);
  adamw_c.step(ctx(), c, 1e-3);
  EXPECT_NE(std::memcmp(b.params_data(), c.params_data(), bytes), 0);
  EXPECT_THROW(adamw_c.set_step_count(-1), Error);
}

// The ranks of a node share the update: each steps its part of the flat buffers. Parts
// that cut through tensors (and padding), stepped one after the other, give the bits of
// the whole step, and a part leaves everything outside it untouched.
TEST(AdamWOptimizer, StepsOfPartsOfTheFlatBufferGiveTheWholeStepsBits) {
  const auto opt = optimizer_section();
  ParamStore whole(specs(), Arena::Mode::allocate);
  ParamStore parts(specs(), Arena::Mode::allocate);
  const std::size_t n = whole.buffer_elements();
  const std::size_t bytes = n * sizeof(float);
  fill(whole.params_data(), n, 6);
  std::memcpy(parts.params_data(), whole.params_data(), bytes);
  AdamW adamw_whole(opt, whole);
  AdamW adamw_parts(opt, parts);
  // Cuts inside "w" (0..15), at its end, inside "b", and an empty part.
  const std::vector<std::size_t> cuts = {0, 7, 16, 16, 40, n};
  for (int t = 1; t <= 3; ++t) {
    fill(whole.grads_data(), n, 200u + static_cast<std::uint32_t>(t));
    std::memcpy(parts.grads_data(), whole.grads_data(), bytes);
    adamw_whole.step(ctx(), whole, 1e-2, 0.5);
    for (std::size_t k = 0; k + 1 < cuts.size(); ++k) {
      // The parts are those of different ranks: one step each, the count advanced once.
      AdamW& a = adamw_parts;
      const std::int64_t before = a.step_count();
      a.step(ctx(), parts, 1e-2, 0.5, cuts[k], cuts[k + 1]);
      if (k + 2 < cuts.size()) a.set_step_count(before);
    }
    ASSERT_EQ(std::memcmp(whole.params_data(), parts.params_data(), bytes), 0) << "step " << t;
    ASSERT_EQ(std::memcmp(adamw_whole.state().m, adamw_parts.state().m, bytes), 0);
    ASSERT_EQ(std::memcmp(adamw_whole.state().v, adamw_parts.state().v, bytes), 0);
    EXPECT_EQ(adamw_parts.step_count(), t);
  }
  // One part only: nothing outside [7, 40) changes.
  std::vector<float> p0(parts.params_data(), parts.params_data() + n);
  std::vector<float> m0(adamw_parts.state().m, adamw_parts.state().m + n);
  fill(parts.grads_data(), n, 300);
  adamw_parts.step(ctx(), parts, 1e-2, 1.0, 7, 40);
  for (std::size_t i = 0; i < n; ++i) {
    const bool inside = i >= 7 && i < 40;
    const bool padding = (i >= 15 && i < 16) || (i >= 21 && i < 32) || i >= 49;
    if (!inside || padding) {
      EXPECT_EQ(parts.params_data()[i], p0[i]) << "element " << i << " outside the part";
      EXPECT_EQ(adamw_parts.state().m[i], m0[i]) << "element " << i << " outside the part";
    } else {
      EXPECT_NE(adamw_parts.state().m[i], m0[i]) << "element " << i << " inside the part";
    }
  }
  EXPECT_THROW(adamw_parts.step(ctx(), parts, 1e-2, 1.0, 8, 7), Error);
  EXPECT_THROW(adamw_parts.step(ctx(), parts, 1e-2, 1.0, 0, n + 1), Error);
}

// ZeRO: each rank's optimizer holds the moments of its shard only. Shards that cut through
// a tensor and padding, each stepped by an optimizer of its own, give the whole step's
// bits, and the moments take the shard's memory only.
TEST(AdamWOptimizer, ShardedMomentsGiveTheWholeStepsBits) {
  const auto opt = optimizer_section();
  ParamStore whole(specs(), Arena::Mode::allocate);
  ParamStore sharded(specs(), Arena::Mode::allocate);
  const std::size_t n = whole.buffer_elements();
  const std::size_t bytes = n * sizeof(float);
  fill(whole.params_data(), n, 8);
  std::memcpy(sharded.params_data(), whole.params_data(), bytes);
  AdamW adamw_whole(opt, whole);
  const std::vector<std::size_t> cuts = {0, 7, 16, 16, n};
  std::vector<std::unique_ptr<AdamW>> shards;
  for (std::size_t k = 0; k + 1 < cuts.size(); ++k) {
    shards.push_back(std::make_unique<AdamW>(opt, sharded, cuts[k], cuts[k + 1]));
    // The shard's moments, each block rounded up to the arena's 64-byte alignment.
    EXPECT_EQ(shards.back()->bytes(), 2 * ((cuts[k + 1] - cuts[k] + 15) / 16 * 16) * sizeof(float));
    EXPECT_EQ(shards.back()->state().first, cuts[k]);
    EXPECT_EQ(shards.back()->state().elements, cuts[k + 1] - cuts[k]);
    EXPECT_TRUE(shards.back()->sharded());
  }
  for (int t = 1; t <= 3; ++t) {
    fill(whole.grads_data(), n, 400u + static_cast<std::uint32_t>(t));
    std::memcpy(sharded.grads_data(), whole.grads_data(), bytes);
    adamw_whole.step(ctx(), whole, 1e-2, 0.5);
    for (auto& a : shards)
      a->step(ctx(), sharded, 1e-2, 0.5);  // its own shard
    ASSERT_EQ(std::memcmp(whole.params_data(), sharded.params_data(), bytes), 0) << "step " << t;
    for (std::size_t k = 0; k < shards.size(); ++k) {
      const AdamWState s = shards[k]->state();
      if (s.elements == 0) continue;  // an empty shard has no buffers (memcmp of null: UB)
      ASSERT_EQ(std::memcmp(adamw_whole.state().m + s.first, s.m, s.elements * sizeof(float)), 0);
      ASSERT_EQ(std::memcmp(adamw_whole.state().v + s.first, s.v, s.elements * sizeof(float)), 0);
    }
  }
  // "w" (elements 0-14) lies in no single shard of [0, 7) and [7, 16): no view of its
  // moments there; "b" lies wholly in the last shard.
  EXPECT_THROW(shards[0]->m(0), Error);
  EXPECT_EQ(shards[3]->m(2).data, shards[3]->state().m + (sharded.spec(2).offset - 16));
  EXPECT_THROW(shards[1]->step(ctx(), sharded, 1e-2, 1.0, 0, 16), Error);
  EXPECT_THROW(AdamW(opt, sharded, 8, n + 1), Error);
  EXPECT_FALSE(adamw_whole.sharded());
}

// ZeRO with bf16/fp16: each shard's optimizer also holds the fp32 master of its shard and
// steps it instead of the store's parameters (then the compute copy). The masters give
// the whole step's bits, the store's parameters stay untouched, and the master takes the
// shard's memory only.
TEST(AdamWOptimizer, MasterShardsGiveTheWholeStepsBits) {
  const auto opt = optimizer_section();
  ParamStore whole(specs(), Arena::Mode::allocate);
  ParamStore compute(specs(), Arena::Mode::allocate);  // the compute copy: never stepped
  const std::size_t n = whole.buffer_elements();
  const std::size_t bytes = n * sizeof(float);
  fill(whole.params_data(), n, 9);
  fill(compute.params_data(), n, 10);
  const std::vector<float> compute_before(compute.params_data(), compute.params_data() + n);
  AdamW adamw_whole(opt, whole);
  EXPECT_FALSE(adamw_whole.has_master());
  EXPECT_EQ(adamw_whole.state().master, nullptr);
  const std::vector<std::size_t> cuts = {0, 7, 16, 16, n};
  std::vector<std::unique_ptr<AdamW>> shards;
  for (std::size_t k = 0; k + 1 < cuts.size(); ++k) {
    shards.push_back(std::make_unique<AdamW>(opt, compute, cuts[k], cuts[k + 1], true));
    EXPECT_TRUE(shards.back()->has_master());
    EXPECT_EQ(shards.back()->master_bytes(),
              (cuts[k + 1] - cuts[k] + 15) / 16 * 16 * sizeof(float));
    const AdamWState s = shards.back()->state();
    if (s.elements > 0) {
      ASSERT_NE(s.master, nullptr);
      std::memcpy(s.master, whole.params_data() + s.first, s.elements * sizeof(float));
    }
  }
  for (int t = 1; t <= 3; ++t) {
    fill(whole.grads_data(), n, 500u + static_cast<std::uint32_t>(t));
    std::memcpy(compute.grads_data(), whole.grads_data(), bytes);
    adamw_whole.step(ctx(), whole, 1e-2, 0.5);
    for (auto& a : shards)
      a->step(ctx(), compute, 1e-2, 0.5);
    for (const auto& a : shards) {
      const AdamWState s = a->state();
      if (s.elements == 0) continue;  // an empty shard has no buffers (memcmp of null: UB)
      ASSERT_EQ(std::memcmp(whole.params_data() + s.first, s.master, s.elements * sizeof(float)), 0)
          << "step " << t << ", shard from " << s.first;
      ASSERT_EQ(std::memcmp(adamw_whole.state().m + s.first, s.m, s.elements * sizeof(float)), 0);
    }
    ASSERT_EQ(std::memcmp(compute.params_data(), compute_before.data(), bytes), 0);
  }
}

TEST(AdamWOptimizer, RejectsMismatchedStoresAndPlansWithoutMemory) {
  ParamStore store(specs(), Arena::Mode::allocate);
  AdamW adamw(optimizer_section(), store);
  auto other_specs = specs();
  other_specs.pop_back();
  ParamStore other(other_specs, Arena::Mode::allocate);
  try {
    adamw.step(ctx(), other, 1e-3);
    ADD_FAILURE() << "expected a layout error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not the one the moments were laid out for"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(adamw.step_count(), 0);
  // A bad hyper-parameter throws before any tensor changes, and the count stays.
  auto bad = optimizer_section();
  bad.betas = {1.0, 0.95};
  AdamW bad_adamw(bad, store);
  EXPECT_THROW(bad_adamw.step(ctx(), store, 1e-3), Error);
  EXPECT_EQ(bad_adamw.step_count(), 0);

  ParamStore plan(specs(), Arena::Mode::plan);
  AdamW planned(optimizer_section(), plan);
  EXPECT_TRUE(planned.planning());
  EXPECT_EQ(planned.bytes(), 2 * plan.buffer_elements() * sizeof(float));
  EXPECT_EQ(planned.state().m, nullptr);
  EXPECT_THROW(planned.step(ctx(), plan, 1e-3), Error);
}

}  // namespace
}  // namespace dst::train
