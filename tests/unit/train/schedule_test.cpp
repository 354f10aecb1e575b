// Learning-rate schedules against their closed forms (train/schedule.hpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "core/error.hpp"
#include "train/schedule.hpp"

namespace dst::train {
namespace {

constexpr double kPi = 3.14159265358979323846;

config::TrainingSection section(const std::string& type, std::int64_t warmup,
                                std::int64_t max_steps) {
  config::TrainingSection t;
  t.max_steps = max_steps;
  t.optimizer.lr = 3e-4;
  t.schedule.type = parse_enum<config::ScheduleType>(type).value();
  t.schedule.warmup_steps = warmup;
  t.schedule.min_lr_ratio = 0.1;
  return t;
}

// The closed forms evaluate the same few double operations in another arrangement: a few
// ulps of the peak.
constexpr double kTol = 1e-15;

TEST(Schedule, WarmupRampsFromPeakOverWarmupToPeak) {
  for (const char* type : {"constant", "cosine", "linear", "inverse_sqrt", "multistep"}) {
    const auto t = section(type, 20, 200);
    SCOPED_TRACE(type);
    EXPECT_NEAR(learning_rate(t, 0, 1), 3e-4 / 20, kTol);  // the first step already trains
    EXPECT_NEAR(learning_rate(t, 9, 1), 3e-4 * 10 / 20, kTol);
    EXPECT_NEAR(learning_rate(t, 19, 1), 3e-4, kTol);  // the peak, on the last warm-up step
    for (std::int64_t s = 1; s < 20; ++s)
      EXPECT_GT(learning_rate(t, s, 1), learning_rate(t, s - 1, 1)) << s;
  }
}

TEST(Schedule, ConstantAfterWarmup) {
  const auto t = section("constant", 5, 100);
  for (std::int64_t s : {5, 50, 99, 100, 1000})
    EXPECT_EQ(learning_rate(t, s, 1), 3e-4) << s;
  EXPECT_EQ(learning_rate(section("constant", 0, 10), 0, 1), 3e-4);
}

TEST(Schedule, CosineAgainstClosedForm) {
  const auto t = section("cosine", 20, 200);
  const double peak = 3e-4, floor = 3e-5;
  for (std::int64_t s = 20; s <= 260; ++s) {
    const double p = std::min(1.0, (s - 20) / 180.0);
    EXPECT_NEAR(learning_rate(t, s, 1), floor + (peak - floor) * 0.5 * (1 + std::cos(kPi * p)),
                kTol)
        << s;
  }
  EXPECT_NEAR(learning_rate(t, 20, 1), peak, kTol);                 // decay starts at the peak
  EXPECT_NEAR(learning_rate(t, 110, 1), (peak + floor) / 2, kTol);  // half way
  EXPECT_NEAR(learning_rate(t, 200, 1), floor, kTol);               // the floor at max_steps
  EXPECT_GT(learning_rate(t, 199, 1), floor);                       // the last step is just above
  EXPECT_NEAR(learning_rate(t, 5000, 1), floor, kTol);              // and stays there
  for (std::int64_t s = 21; s <= 200; ++s)
    EXPECT_LT(learning_rate(t, s, 1), learning_rate(t, s - 1, 1)) << s;
}

TEST(Schedule, LinearAgainstClosedForm) {
  auto t = section("linear", 10, 110);
  t.schedule.min_lr_ratio = 0.0;
  for (std::int64_t s = 10; s <= 120; ++s)
    EXPECT_NEAR(learning_rate(t, s, 1), 3e-4 * (1.0 - std::min(1.0, (s - 10) / 100.0)), kTol) << s;
  EXPECT_EQ(learning_rate(t, 110, 1), 0.0);  // to zero with min_lr_ratio 0
  EXPECT_NEAR(learning_rate(t, 60, 1), 1.5e-4, kTol);
}

TEST(Schedule, DecayWithoutRoomAfterWarmupIsAtTheFloor) {
  // max_steps == warmup_steps: no decay phase; a step past it is at the floor.
  const auto t = section("cosine", 10, 10);
  EXPECT_NEAR(learning_rate(t, 9, 1), 3e-4, kTol);
  EXPECT_NEAR(learning_rate(t, 10, 1), 3e-5, kTol);
  // No warm-up: step 0 is at the peak.
  EXPECT_NEAR(learning_rate(section("cosine", 0, 100), 0, 1), 3e-4, kTol);
}

TEST(Schedule, InverseSqrtAgainstDefinition) {
  const auto t = section("inverse_sqrt", 20, 100000);
  // lr * sqrt(W / (s + 1)) for s >= W, floored at min_lr_ratio * lr.
  EXPECT_NEAR(learning_rate(t, 19, 1), 3e-4, kTol);  // continuous with the warm-up
  EXPECT_NEAR(learning_rate(t, 20, 1), 3e-4 * std::sqrt(20.0 / 21.0), kTol);
  EXPECT_NEAR(learning_rate(t, 79, 1), 1.5e-4, kTol);   // 4x the steps, half the rate
  EXPECT_NEAR(learning_rate(t, 1999, 1), 3e-5, kTol);   // sqrt(20/2000) = 0.1: the floor
  EXPECT_NEAR(learning_rate(t, 50000, 1), 3e-5, kTol);  // held there
  for (std::int64_t s : {25, 100, 777, 1500})
    EXPECT_NEAR(learning_rate(t, s, 1), 3e-4 * std::sqrt(20.0 / (s + 1.0)), kTol) << s;
  // Without warm-up: lr / sqrt(s + 1).
  const auto t0 = section("inverse_sqrt", 0, 1000);
  EXPECT_NEAR(learning_rate(t0, 0, 1), 3e-4, kTol);
  EXPECT_NEAR(learning_rate(t0, 3, 1), 1.5e-4, kTol);
}

TEST(Schedule, MultistepDeepSeekDefaults) {
  // DeepSeek-LLM: 31.6% of the peak from 80% of the steps, 10% from 90% (deck defaults).
  const auto t = section("multistep", 2000, 10000);
  EXPECT_EQ(t.schedule.milestones, (std::vector<double>{0.8, 0.9}));
  EXPECT_NEAR(learning_rate(t, 1999, 1), 3e-4, kTol);
  EXPECT_EQ(learning_rate(t, 2000, 1), 3e-4);
  EXPECT_EQ(learning_rate(t, 7999, 1), 3e-4);
  EXPECT_NEAR(learning_rate(t, 8000, 1), 0.316 * 3e-4, kTol);
  EXPECT_NEAR(learning_rate(t, 8999, 1), 0.316 * 3e-4, kTol);
  EXPECT_NEAR(learning_rate(t, 9000, 1), 0.1 * 3e-4, kTol);
  EXPECT_NEAR(learning_rate(t, 9999, 1), 0.1 * 3e-4, kTol);
  EXPECT_NEAR(learning_rate(t, 20000, 1), 0.1 * 3e-4, kTol);
}

TEST(Schedule, MilestoneStepsOfDecimalFractions) {
  EXPECT_EQ(milestone_step(0.8, 200), 160);
  EXPECT_EQ(milestone_step(0.9, 200), 180);
  EXPECT_EQ(milestone_step(0.07, 100), 7);   // 0.07 * 100 is 7.000000000000001 in double
  EXPECT_EQ(milestone_step(0.07, 300), 21);  // 21.000000000000004
  EXPECT_EQ(milestone_step(0.29, 100), 29);  // 28.999999999999996
  EXPECT_EQ(milestone_step(0.85, 10), 9);    // 8.5: the first whole step at or past it
  EXPECT_EQ(milestone_step(0.5, 1), 1);
  auto t = section("multistep", 0, 10);
  t.schedule.milestones = {0.3, 0.7};
  t.schedule.factors = {0.5, 0.25};
  EXPECT_EQ(learning_rate(t, 2, 1), 3e-4);
  EXPECT_EQ(learning_rate(t, 3, 1), 0.5 * 3e-4);
  EXPECT_EQ(learning_rate(t, 6, 1), 0.5 * 3e-4);
  EXPECT_EQ(learning_rate(t, 7, 1), 0.25 * 3e-4);
}

TEST(Schedule, WorldSizeScalesThePeakAndEverythingDerivedFromIt) {
  auto t = section("cosine", 20, 200);
  t.schedule.reference_world_size = 2;
  EXPECT_EQ(peak_learning_rate(t, 8), 3e-4);  // none
  t.schedule.world_size_scaling = config::WorldSizeScaling::linear;
  EXPECT_NEAR(peak_learning_rate(t, 8), 4 * 3e-4, kTol);
  EXPECT_NEAR(peak_learning_rate(t, 1), 0.5 * 3e-4, kTol);
  EXPECT_NEAR(learning_rate(t, 19, 8), 4 * 3e-4, kTol);
  EXPECT_NEAR(learning_rate(t, 200, 8), 4 * 3e-5, kTol);  // the floor scales too
  t.schedule.world_size_scaling = config::WorldSizeScaling::sqrt;
  EXPECT_NEAR(peak_learning_rate(t, 8), 2 * 3e-4, kTol);
  EXPECT_NEAR(learning_rate(t, 0, 8), 2 * 3e-4 / 20, kTol);
}

TEST(Schedule, RejectsInvalidInput) {
  auto expect_error = [](auto f, const std::string& part) {
    try {
      f();
      ADD_FAILURE() << "expected dst::Error containing '" << part << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  const auto t = section("cosine", 20, 200);
  expect_error([&] { learning_rate(t, -1, 1); }, "step is 0-based");
  expect_error([&] { learning_rate(t, 0, 0); }, "world_size must be >= 1, got 0");
  auto bad = section("multistep", 0, 100);
  bad.schedule.factors = {0.5};
  expect_error([&] { learning_rate(bad, 0, 1); }, "milestones has 2 entries but factors has 1");
}

}  // namespace
}  // namespace dst::train
