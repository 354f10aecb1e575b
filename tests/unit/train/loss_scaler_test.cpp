// The fp16 dynamic loss scaler (train/loss_scaler.hpp): its rules, step by step.
#include <gtest/gtest.h>

#include "core/error.hpp"
#include "train/loss_scaler.hpp"

namespace {

using dst::train::LossScaler;

TEST(LossScaler, StartsAt2To16) {
  const LossScaler s;
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_EQ(s.clean_steps(), 0);
}

TEST(LossScaler, DoublesAfterExactly2000CleanSteps) {
  LossScaler s;
  for (int i = 1; i < 2000; ++i) {
    ASSERT_FALSE(s.update(false)) << i;
    ASSERT_EQ(s.scale(), 65536.0) << i;
    ASSERT_EQ(s.clean_steps(), i);
  }
  EXPECT_TRUE(s.update(false));  // the 2000th
  EXPECT_EQ(s.scale(), 131072.0);
  EXPECT_EQ(s.clean_steps(), 0);
  for (int i = 1; i < 2000; ++i)
    ASSERT_FALSE(s.update(false));
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 262144.0);
}

TEST(LossScaler, OverflowHalvesAndRestartsTheCount) {
  LossScaler s;
  for (int i = 0; i < 1999; ++i)
    s.update(false);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 32768.0);
  EXPECT_EQ(s.clean_steps(), 0);
  // 1999 clean steps before the overflow do not count towards growth any more.
  for (int i = 0; i < 1999; ++i)
    ASSERT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 32768.0);
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 65536.0);
}

TEST(LossScaler, FloorAndCeiling) {
  LossScaler s;
  for (int i = 0; i < 16; ++i)
    EXPECT_TRUE(s.update(true));  // 2^16 -> 2^0
  EXPECT_EQ(s.scale(), 1.0);
  EXPECT_FALSE(s.update(true));  // the floor holds
  EXPECT_EQ(s.scale(), LossScaler::kMinScale);
  s.set_state(LossScaler::kMaxScale, LossScaler::kGrowthInterval - 1);
  EXPECT_FALSE(s.update(false));  // would double: the ceiling holds
  EXPECT_EQ(s.scale(), LossScaler::kMaxScale);
  EXPECT_EQ(s.clean_steps(), 0);
}

TEST(LossScaler, StateRoundTrip) {
  LossScaler a;
  a.update(true);
  for (int i = 0; i < 17; ++i)
    a.update(false);
  LossScaler b;
  b.set_state(a.scale(), a.clean_steps());
  EXPECT_EQ(b.scale(), 32768.0);
  EXPECT_EQ(b.clean_steps(), 17);
  // Both continue identically: growth after the remaining 1983 clean steps.
  for (int i = 0; i < 1983; ++i) {
    ASSERT_EQ(a.update(false), b.update(false));
    ASSERT_EQ(a.scale(), b.scale());
  }
  EXPECT_EQ(b.scale(), 65536.0);
}

TEST(LossScaler, RefusesABadRestoredState) {
  LossScaler s;
  EXPECT_THROW(s.set_state(0.5, 0), dst::Error);
  EXPECT_THROW(s.set_state(1e30, 0), dst::Error);
  EXPECT_THROW(s.set_state(65536.0, -1), dst::Error);
  EXPECT_EQ(s.scale(), 65536.0);  // unchanged by a refused state
}

}  // namespace
