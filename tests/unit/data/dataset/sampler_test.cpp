// Sampler and FeistelPermutation: bijection, randomness sanity, step splitting, resume.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <vector>

#include "core/error.hpp"
#include "data/dataset/sampler.hpp"

namespace dst::data {
namespace {

std::vector<std::uint64_t> images(const FeistelPermutation& p) {
  std::vector<std::uint64_t> out(p.size());
  for (std::uint64_t x = 0; x < p.size(); ++x)
    out[x] = p(x);
  return out;
}

// The sizes below: every n in 1..300 (primes, powers of two and their neighbours up to
// 257 included), then the neighbours of 512 and 1024, and 1000.
std::vector<std::uint64_t> bijection_sizes() {
  std::vector<std::uint64_t> sizes;
  for (std::uint64_t n = 1; n <= 300; ++n)
    sizes.push_back(n);
  for (const std::uint64_t n : {511u, 512u, 513u, 1000u, 1023u, 1024u, 1025u})
    sizes.push_back(n);
  return sizes;
}

// For each of those sizes: the images of [0, n) are exactly [0, n), and inverse undoes the
// permutation.
TEST(FeistelPermutation, IsABijectionForEverySmallSize) {
  for (const std::uint64_t n : bijection_sizes()) {
    const FeistelPermutation p(n, /*seed=*/42, /*epoch=*/0);
    std::vector<std::uint64_t> seen(n, 0);
    for (std::uint64_t x = 0; x < n; ++x) {
      const std::uint64_t y = p(x);
      ASSERT_LT(y, n) << "n=" << n << " x=" << x;
      ++seen[y];
      ASSERT_EQ(p.inverse(y), x) << "n=" << n << " x=" << x;
    }
    ASSERT_TRUE(std::all_of(seen.begin(), seen.end(), [](auto c) { return c == 1; }))
        << "n=" << n << " is not a bijection";
  }
}

TEST(FeistelPermutation, IsNotTheIdentityAndMovesMostElements) {
  for (std::uint64_t n : {8u, 97u, 128u, 1000u, 1024u, 4099u}) {
    const auto y = images(FeistelPermutation(n, 42, 0));
    std::uint64_t fixed = 0;
    for (std::uint64_t x = 0; x < n; ++x)
      fixed += y[x] == x;
    // A uniform permutation has 1 fixed point on average; 10 % of n (>= 3) would mean a
    // badly mixing round function.
    EXPECT_LE(fixed, std::max<std::uint64_t>(3, n / 10)) << "n=" << n;
  }
}

TEST(FeistelPermutation, EpochsAndSeedsGiveDifferentOrders) {
  const std::uint64_t n = 1000;
  const auto e0 = images(FeistelPermutation(n, 7, 0));
  const auto e1 = images(FeistelPermutation(n, 7, 1));
  const auto s8 = images(FeistelPermutation(n, 8, 0));
  EXPECT_NE(e0, e1);
  EXPECT_NE(e0, s8);
  EXPECT_EQ(e0, images(FeistelPermutation(n, 7, 0)));  // a pure function of its key
  // Different orders, not just a rotation: the first 10 positions mostly differ.
  int same = 0;
  for (int k = 0; k < 10; ++k)
    same += e0[k] == e1[k];
  EXPECT_LE(same, 2);
}

// 2^40 + 7 samples: spot checks without materialising anything (the object is a few
// words; a bijection check over 2^40 values is out of reach, distinctness of 200 000
// images of spread-out inputs and the inverse are not).
TEST(FeistelPermutation, HugeDomainSpotChecks) {
  const std::uint64_t n = (std::uint64_t{1} << 40) + 7;
  const FeistelPermutation p(n, 1234, 3);
  static_assert(sizeof(FeistelPermutation) <= 32, "the permutation must stay O(1) in memory");
  std::vector<std::uint64_t> ys;
  const std::uint64_t stride = n / 20000;
  for (std::uint64_t k = 0; k < 20000; ++k) {
    for (const std::uint64_t x : {k, k * stride + 100000}) {  // the start; spread out
      const std::uint64_t y = p(x);
      ASSERT_LT(y, n);
      ASSERT_EQ(p.inverse(y), x);
      ys.push_back(y);
    }
  }
  for (std::uint64_t x = n - 100; x < n; ++x)
    ASSERT_EQ(p.inverse(p(x)), x);  // the top
  std::sort(ys.begin(), ys.end());
  EXPECT_EQ(std::adjacent_find(ys.begin(), ys.end()), ys.end()) << "two inputs share an image";
  // The images of 0..19999 are spread over the domain, not clustered near the inputs.
  EXPECT_GT(ys.back(), n / 2);
  EXPECT_THROW(p(n), Error);
  EXPECT_THROW(p.inverse(n), Error);
}

TEST(FeistelPermutation, LargestDomainWorks) {
  const std::uint64_t n = ~std::uint64_t{0};
  const FeistelPermutation p(n, 1, 0);
  for (std::uint64_t x : {std::uint64_t{0}, std::uint64_t{1}, n - 1, n / 3})
    EXPECT_EQ(p.inverse(p(x)), x);
}

// The reproducibility contract: the order of a given (seed, epoch) never changes. If
// this fails, sampler.hpp's contract changed, and resumed runs would see other data.
TEST(Sampler, GoldenFirstBatch) {
  SamplerConfig c;
  c.num_samples = 1000;
  c.seed = 1234;
  c.global_batch_size = 8;
  c.micro_batch_size = 8;
  const Sampler s(c);
  const std::vector<std::uint64_t> golden = {787, 534, 284, 669, 595, 216, 986, 423};
  EXPECT_EQ(s.global_batch({0, 0}), golden);
}

SamplerConfig config(std::uint64_t n, std::uint64_t g, std::uint64_t micro, int rank, int size) {
  SamplerConfig c;
  c.num_samples = n;
  c.seed = 99;
  c.global_batch_size = g;
  c.micro_batch_size = micro;
  c.dp_rank = rank;
  c.dp_size = size;
  return c;
}

// Per step: the ranks' micro-batches are disjoint, their union in rank order is the
// global batch, and the global batch does not depend on the number of ranks.
TEST(Sampler, StepsSplitDisjointlyAndIndependentlyOfRankCount) {
  const std::uint64_t n = 203, g = 16;  // 12 steps per epoch, 11 samples dropped
  const Sampler reference(config(n, g, g, 0, 1));
  for (const int size : {1, 2, 4}) {
    for (const std::uint64_t micro : {std::uint64_t{1}, std::uint64_t{2}, g / size}) {
      std::vector<Sampler> ranks;
      for (int r = 0; r < size; ++r)
        ranks.emplace_back(config(n, g, micro, r, size));
      for (int step = 0; step < 30; ++step) {  // 2.5 epochs
        const SamplePosition pos = ranks[0].position();
        std::vector<std::uint64_t> concat;
        for (auto& s : ranks) {
          ASSERT_EQ(s.position(), pos);
          const auto micro_batches = s.next_step();
          ASSERT_EQ(micro_batches.size(), g / (size * micro));
          for (const auto& mb : micro_batches) {
            ASSERT_EQ(mb.size(), micro);
            concat.insert(concat.end(), mb.begin(), mb.end());
          }
        }
        ASSERT_EQ(concat, reference.global_batch(pos)) << "ranks " << size << " step " << step;
        ASSERT_EQ(std::set<std::uint64_t>(concat.begin(), concat.end()).size(), g);
      }
    }
  }
}

TEST(Sampler, EpochUsesDistinctSamplesDropsTheTailAndReshuffles) {
  const std::uint64_t n = 203, g = 16;
  Sampler s(config(n, g, 4, 0, 1));
  EXPECT_EQ(s.steps_per_epoch(), 12u);
  std::vector<std::uint64_t> epoch0, epoch1;
  for (int step = 0; step < 12; ++step)
    for (const auto& mb : s.next_step())
      epoch0.insert(epoch0.end(), mb.begin(), mb.end());
  EXPECT_EQ(s.position(), (SamplePosition{1, 0}));  // the 11-sample tail is dropped
  for (int step = 0; step < 12; ++step)
    for (const auto& mb : s.next_step())
      epoch1.insert(epoch1.end(), mb.begin(), mb.end());
  EXPECT_EQ(std::set<std::uint64_t>(epoch0.begin(), epoch0.end()).size(), 12 * g);
  EXPECT_EQ(std::set<std::uint64_t>(epoch1.begin(), epoch1.end()).size(), 12 * g);
  EXPECT_NE(epoch0, epoch1);
  for (const auto id : epoch0)
    EXPECT_LT(id, n);
}

TEST(Sampler, ResumeFromAPositionContinuesExactly) {
  const std::uint64_t n = 203, g = 16;
  for (const int stop_after : {0, 1, 5, 11, 12, 13, 20}) {
    Sampler run(config(n, g, 4, 1, 2));
    for (int k = 0; k < stop_after; ++k)
      run.next_step();
    const SamplePosition saved = run.position();
    Sampler resumed(config(n, g, 4, 1, 2));
    resumed.seek(saved);
    for (int k = 0; k < 15; ++k)
      ASSERT_EQ(resumed.next_step(), run.next_step()) << stop_after;
  }
}

TEST(Sampler, SeekNormalisesAndRejectsPositionsPastTheEpoch) {
  Sampler s(config(203, 16, 4, 0, 1));
  s.seek({2, 200});  // fewer than a global batch left: next epoch
  EXPECT_EQ(s.position(), (SamplePosition{3, 0}));
  s.seek({2, 187});  // exactly one batch left: stays
  EXPECT_EQ(s.position(), (SamplePosition{2, 187}));
  EXPECT_THROW(s.seek({0, 204}), Error);
}

TEST(Sampler, RejectsInconsistentConfigurations) {
  EXPECT_THROW(Sampler(config(100, 10, 4, 0, 1)), Error);  // 10 % 4 != 0
  EXPECT_THROW(Sampler(config(100, 8, 2, 0, 3)), Error);   // 8 % (3 * 2) != 0
  EXPECT_THROW(Sampler(config(7, 8, 8, 0, 1)), Error);     // fewer samples than a batch
  EXPECT_THROW(Sampler(config(100, 8, 0, 0, 1)), Error);
  EXPECT_THROW(Sampler(config(100, 8, 4, 2, 2)), Error);  // rank out of range
  try {
    Sampler(config(100, 10, 4, 0, 1));
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("global_batch_size 10"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dst::data
