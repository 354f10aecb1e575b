// Core layer: errors, rank-aware logging, dtypes, deadlines, step context.
#include <gtest/gtest.h>

#include <thread>

#include "core/deadline.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/step_context.hpp"

namespace {

using dst::log::Level;

// Restores the logger's global state after a test changes it.
struct LogStateGuard {
  Level level = dst::log::level();
  int rank = dst::log::rank();
  ~LogStateGuard() {
    dst::log::set_level(level);
    dst::log::set_rank(rank);
  }
};

TEST(Error, DeckErrorNamesLocationAndKey) {
  const dst::DeckError e("training.max_steps", "deck.yaml:3:5", "must be >= 0, got -1");
  EXPECT_STREQ(e.what(), "deck.yaml:3:5: training.max_steps: must be >= 0, got -1");
  EXPECT_EQ(e.key(), "training.max_steps");
  EXPECT_EQ(e.where(), "deck.yaml:3:5");
}

TEST(Error, RequireThrowsWithValueAndLocation) {
  const int n = -3;
  try {
    DST_REQUIRE(n > 0, "size must be positive, got " << n);
    FAIL() << "DST_REQUIRE did not throw";
  } catch (const dst::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("size must be positive, got -3"), std::string::npos) << m;
    EXPECT_NE(m.find("core_test.cpp:"), std::string::npos) << m;
  }
}

TEST(Log, ParseLevel) {
  EXPECT_EQ(dst::log::parse_level("debug"), Level::debug);
  EXPECT_EQ(dst::log::parse_level("warning"), Level::warn);
  EXPECT_EQ(dst::log::parse_level("off"), Level::off);
  EXPECT_THROW(dst::log::parse_level("verbose"), dst::UsageError);
}

TEST(Log, InfoOnlyFromRankZeroWarningsFromAnyRankWithPrefix) {
  LogStateGuard guard;
  dst::log::set_level(Level::info);
  dst::log::set_rank(3);
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  dst::log::info("progress line");
  dst::log::warn("slow shard");
  const std::string out = testing::internal::GetCapturedStdout();
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(out, "");  // rank 3 does not print progress
  EXPECT_EQ(err, "[rank 3] warning: slow shard\n");

  dst::log::set_rank(0);
  testing::internal::CaptureStdout();
  dst::log::info("progress line");
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "progress line\n");
}

TEST(Log, LevelFilters) {
  LogStateGuard guard;
  dst::log::set_rank(0);
  dst::log::set_level(Level::error);
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  dst::log::info("hidden");
  dst::log::warn("hidden");
  dst::log::error("shown");
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "");
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "[rank 0] error: shown\n");
}

TEST(Log, UnknownRankBeforeMpi) {
  LogStateGuard guard;
  dst::log::set_rank(-1);
  EXPECT_EQ(dst::log::rank_prefix(), "[rank ?]");
}

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dst::dtype_size(dst::DType::f32), 4u);
  EXPECT_EQ(dst::dtype_size(dst::DType::bf16), 2u);
  EXPECT_EQ(dst::dtype_size(dst::DType::u64), 8u);
  EXPECT_EQ(dst::dtype_size(dst::DType::u8), 1u);
  EXPECT_EQ(dst::dtype_name(dst::DType::bf16), "bf16");
  EXPECT_EQ(dst::dtype_of<double>::value, dst::DType::f64);
}

TEST(Deadline, ExpiresAfterItsLimitAndNeverWhenZero) {
  const dst::core::Deadline never(0.0);
  const dst::core::Deadline soon(0.02);
  EXPECT_FALSE(soon.expired());
  std::this_thread::sleep_for(std::chrono::milliseconds(40));
  EXPECT_TRUE(soon.expired());
  EXPECT_FALSE(never.expired());
  EXPECT_GE(soon.elapsed_s(), 0.02);
}

TEST(StepContext, DescribesStartupAndSteps) {
  EXPECT_EQ(dst::core::describe_current_step(), "start-up");
  dst::core::set_current_step(12);
  EXPECT_EQ(dst::core::describe_current_step(), "step 12");
  dst::core::set_current_step(dst::core::kStartupStep);
}

}  // namespace
