// train::ZeroShards: the ranks' contiguous shards of the flat buffer under ZeRO cover it
// in rank order, shards of whole tensors start at tensor starts near k/N, the shm parts
// are comm::SharedSum's, and a range's blocks per rank add up to it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <vector>

#include "comm/shared_sum.hpp"
#include "core/error.hpp"
#include "model/param_store.hpp"
#include "train/zero_shards.hpp"

namespace dst::train {
namespace {

using model::ParamSpec;
using model::ParamStore;

/// Tensors of 1024, 16, 4096, 16 and 2048 elements (offsets 16-float aligned: no padding).
ParamStore store() {
  return ParamStore({ParamSpec{"a", {32, 32}, model::Init::normal, 0.02f, true, 0},
                     ParamSpec{"n1", {16}, model::Init::ones, 0.0f, false, 0},
                     ParamSpec{"b", {64, 64}, model::Init::normal, 0.02f, true, 0},
                     ParamSpec{"n2", {16}, model::Init::ones, 0.0f, false, 0},
                     ParamSpec{"c", {32, 64}, model::Init::normal, 0.02f, true, 0}},
                    tensor::Arena::Mode::plan);
}

void expect_cover(const ZeroShards& s, std::size_t elements, int ranks) {
  ASSERT_EQ(s.ranks(), ranks);
  EXPECT_EQ(s.elements(), elements);
  EXPECT_EQ(s.first(0), 0u);
  EXPECT_EQ(s.last(ranks - 1), elements);
  for (int r = 0; r + 1 < ranks; ++r)
    EXPECT_EQ(s.last(r), s.first(r + 1));
  const auto sizes = s.sizes();
  EXPECT_EQ(std::accumulate(sizes.begin(), sizes.end(), std::size_t{0}), elements);
}

TEST(ZeroShards, ShardsOfWholeTensorsStartAtTheTensorStartNearestKOverN) {
  const ParamStore ps = store();
  const std::size_t n = ps.buffer_elements();
  ASSERT_EQ(n, 1024u + 16 + 4096 + 16 + 2048);
  const ZeroShards one = ZeroShards::by_tensors(ps, 1);
  expect_cover(one, n, 1);
  // 2 ranks: n/2 = 3600; tensor starts 0, 1024, 1040, 5136, 5152: 5136 is nearer.
  const ZeroShards two = ZeroShards::by_tensors(ps, 2);
  expect_cover(two, n, 2);
  EXPECT_EQ(two.first(1), 5136u);
  // 4 ranks: 1800 -> 1040, 3600 -> 5136, 5400 -> 5152 (248 away, 5136 is 264).
  const ZeroShards four = ZeroShards::by_tensors(ps, 4);
  expect_cover(four, n, 4);
  EXPECT_EQ(four.first(1), 1040u);
  EXPECT_EQ(four.first(2), 5136u);
  EXPECT_EQ(four.first(3), 5152u);
  // 8 ranks: 1800 and 2700 both -> 1040: rank 2 owns nothing (tensor b spans its 1/8).
  const ZeroShards eight = ZeroShards::by_tensors(ps, 8);
  expect_cover(eight, n, 8);
  EXPECT_EQ(eight.first(2), 1040u);
  EXPECT_EQ(eight.sizes()[2], 0u);
  // Every tensor lies in one shard.
  for (int ranks : {2, 3, 4, 7}) {
    const ZeroShards s = ZeroShards::by_tensors(ps, ranks);
    expect_cover(s, n, ranks);
    for (const auto& spec : ps.specs()) {
      const auto c = s.counts(spec.offset, spec.offset + spec.shape.numel());
      EXPECT_EQ(std::count_if(c.begin(), c.end(), [](std::size_t k) { return k > 0; }), 1)
          << spec.name << " at " << ranks << " ranks";
    }
  }
  EXPECT_THROW(ZeroShards::by_tensors(ps, 0), Error);
}

TEST(ZeroShards, ShardsOfARangeCoverItsTensorsRelativeToItsStart) {
  // The part of the buffer from tensor b on (expert parallelism's own experts: the last
  // tensors), [1040, 7200): starts 0, 4096, 4112 relative to 1040.
  const ParamStore ps = store();
  const std::size_t begin = 1040, end = ps.buffer_elements();
  const ZeroShards two = ZeroShards::by_tensors(ps, 2, begin, end);
  expect_cover(two, end - begin, 2);
  // Half of 6160 is 3080: 4096 is nearer than 0.
  EXPECT_EQ(two.first(1), 4096u);
  // The part before it, [0, 1040): tensors a and n1 only; 520 -> 1024 (504 away, 0 is 520).
  const ZeroShards front = ZeroShards::by_tensors(ps, 2, 0, begin);
  expect_cover(front, begin, 2);
  EXPECT_EQ(front.first(1), 1024u);
  EXPECT_THROW(ZeroShards::by_tensors(ps, 2, begin, end + 1), Error);
  EXPECT_THROW(ZeroShards::by_tensors(ps, 2, end, begin), Error);
}

TEST(ZeroShards, PartsAreTheSharedSumsAndRangesSplitByRank) {
  const std::size_t n = 1000;
  const ZeroShards s = ZeroShards::by_parts(n, 3);
  expect_cover(s, n, 3);
  for (int r = 0; r < 3; ++r) {
    std::size_t first = 0, last = 0;
    comm::SharedSum::part_of(n, 3, r, first, last);
    EXPECT_EQ(s.first(r), first);
    EXPECT_EQ(s.last(r), last);
  }
  // [300, 700): the end of part 0, all of part 1, the start of part 2.
  const auto c = s.counts(300, 700);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0], s.last(0) - 300);
  EXPECT_EQ(c[1], s.last(1) - s.first(1));
  EXPECT_EQ(c[2], 700 - s.first(2));
  EXPECT_EQ(s.counts(5, 5), (std::vector<std::size_t>{0, 0, 0}));
  EXPECT_THROW(s.counts(10, 5), Error);
  EXPECT_THROW(s.counts(0, n + 1), Error);
}

}  // namespace
}  // namespace dst::train
