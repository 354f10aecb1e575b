// data::BatchSource owns the run's one sampler: it hands out each step's samples in the
// sampler's order and promises the store the next step's samples while read-ahead
// allows, never more steps than it was told (no read left in flight at the end).
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "core/error.hpp"
#include "data/sample_store.hpp"
#include "train/faults.hpp"

namespace dst::train {
namespace {

constexpr std::int64_t kT = 3;

/// Sample i is (i, i, ..., i); records the calls in order.
class RecordingStore final : public data::SampleStore {
 public:
  std::uint64_t num_samples() const override { return 40; }
  void read(const std::vector<std::uint64_t>& ids, std::int32_t* out) override {
    calls.push_back({'r', ids});
    for (std::size_t i = 0; i < ids.size(); ++i)
      for (std::int64_t t = 0; t <= kT; ++t)
        out[i * (kT + 1) + static_cast<std::size_t>(t)] = static_cast<std::int32_t>(ids[i]);
  }
  void prefetch(const std::vector<std::uint64_t>& ids) override { calls.push_back({'p', ids}); }
  struct Call {
    char kind;
    std::vector<std::uint64_t> ids;
  };
  std::vector<Call> calls;
};

data::SamplerConfig config() {
  data::SamplerConfig c;
  c.num_samples = 40;
  c.seed = 7;
  c.global_batch_size = 8;
  c.micro_batch_size = 2;
  c.dp_rank = 1;
  c.dp_size = 2;
  return c;
}

TEST(BatchSource, HandsOutTheSamplersStepsInOrder) {
  RecordingStore store;
  data::BatchSource source(store, config(), kT);
  const data::Sampler reference(config());
  std::vector<std::int32_t> batch(2 * 2 * (kT + 1));
  for (int step = 0; step < 3; ++step) {
    const auto want = reference.rank_step(source.sampler().position());
    source.next_step(batch.data());
    ASSERT_EQ(want.size(), 2u);
    for (std::size_t m = 0; m < 2; ++m)
      for (std::size_t i = 0; i < 2; ++i)
        EXPECT_EQ(batch[(m * 2 + i) * (kT + 1)], static_cast<std::int32_t>(want[m][i]));
  }
  for (const auto& c : store.calls)
    EXPECT_EQ(c.kind, 'r') << "no read-ahead was asked for";
}

TEST(BatchSource, PromisesTheNextStepBeforeItIsReadAndNoMoreThanAsked) {
  RecordingStore store;
  data::BatchSource source(store, config(), kT);
  source.read_ahead(2);
  std::vector<std::int32_t> batch(2 * 2 * (kT + 1));
  for (int step = 0; step < 3; ++step)
    source.next_step(batch.data());
  // p p (step 1 promised) r r (step 1 read) p p (step 2 promised) r r r r (steps 2, 3 read)
  const std::string kinds = [&] {
    std::string s;
    for (const auto& c : store.calls)
      s += c.kind;
    return s;
  }();
  EXPECT_EQ(kinds, "pprrpprrrr");
  // Every promise is followed by the reads of the same ids, in order.
  EXPECT_EQ(store.calls[0].ids, store.calls[2].ids);
  EXPECT_EQ(store.calls[1].ids, store.calls[3].ids);
  EXPECT_EQ(store.calls[4].ids, store.calls[6].ids);
  EXPECT_EQ(store.calls[5].ids, store.calls[7].ids);
}

TEST(BatchSource, SeekAfterAPromiseIsRefused) {
  RecordingStore store;
  data::BatchSource source(store, config(), kT);
  source.seek({0, 8});
  EXPECT_EQ(source.sampler().position().consumed, 8u);
  source.read_ahead(1);
  EXPECT_THROW(source.seek({0, 16}), Error);
  EXPECT_THROW(source.read_ahead(-1), Error);
}

TEST(Faults, ApplyToTheirRankAndStepOnly) {
  config::DebugSection d;
  d.inject_nan_step = 3;
  d.inject_overflow_step = 5;
  d.inject_divergence_rank = 1;
  d.inject_exit_in_checkpoint = true;
  d.inject_read_delay_ms = 12;
  const Faults last(d, 3, 4), first(d, 0, 4), second(d, 1, 4);
  ASSERT_TRUE(last.gradient_poison(3).has_value());
  EXPECT_NE(*last.gradient_poison(3), *last.gradient_poison(3));  // NaN
  EXPECT_EQ(*last.gradient_poison(5), std::numeric_limits<float>::infinity());
  EXPECT_FALSE(last.gradient_poison(4).has_value());
  EXPECT_FALSE(first.gradient_poison(3).has_value()) << "only the last rank poisons";
  EXPECT_TRUE(second.diverges_after(0));
  EXPECT_FALSE(second.diverges_after(1));
  EXPECT_FALSE(first.diverges_after(0));
  EXPECT_EQ(first.checkpoint_exit_rank(false), -1) << "only once a checkpoint exists";
  EXPECT_EQ(first.checkpoint_exit_rank(true), 3);
  EXPECT_EQ(first.read_delay_ms(), 12);
  first.before_step(1, true);  // no exit or hang configured: returns
}

}  // namespace
}  // namespace dst::train
