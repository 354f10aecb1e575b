// The deadline-bounded collectives over a raw MPI communicator (runtime/mpi_collectives.hpp)
// at 1, 2 and 4 ranks: results, the agreement on the lowest failing rank, and rank 0's
// work (a file read) reaching every rank, its failure included.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "config/deck.hpp"
#include "mpi_world.hpp"
#include "runtime/mpi_collectives.hpp"

namespace {

using dst::runtime::MpiCollectives;
using dst::runtime::RootResult;
using dst::test::world_rank;
using dst::test::world_size;

MpiCollectives world(double timeout_s = 60.0) {
  return MpiCollectives(MPI_COMM_WORLD, timeout_s,
                        [](const std::string& op) { return "test: " + op; });
}

/// A path only rank 0 has written (the ranks share the file system here, so the test
/// writes it on rank 0 alone and the others never read it).
std::string rank0_file(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "dst-mpi-collectives-" + name;
  if (world_rank() == 0) std::ofstream(path) << text;
  return path;
}

TEST(MpiCollectives, AllreduceGatherAndAllgatherGiveEveryRanksValues) {
  auto coll = world();
  const int r = coll.rank(), n = coll.size();
  EXPECT_EQ(r, world_rank());
  EXPECT_EQ(n, world_size());

  std::int64_t sums[2] = {r, 1};
  coll.allreduce(sums, 2, MPI_INT64_T, MPI_SUM);
  EXPECT_EQ(sums[0], static_cast<std::int64_t>(n) * (n - 1) / 2);
  EXPECT_EQ(sums[1], n);

  const int mine[2] = {r, 10 * r};
  std::vector<int> all(2 * static_cast<std::size_t>(n), -1);
  coll.gather(mine, 2, MPI_INT, all.data(), 0);
  if (r == 0)
    for (int q = 0; q < n; ++q) {
      EXPECT_EQ(all[2 * q], q);
      EXPECT_EQ(all[2 * q + 1], 10 * q);
    }

  // Rank q contributes q + 1 values q.
  const std::vector<std::uint64_t> values(static_cast<std::size_t>(r) + 1, r);
  std::vector<int> counts(n), displs(n);
  for (int q = 0, at = 0; q < n; at += q + 1, ++q) {
    counts[q] = q + 1;
    displs[q] = at;
  }
  std::vector<std::uint64_t> gathered(r == 0 ? static_cast<std::size_t>(n) * (n + 1) / 2 : 0);
  coll.gatherv(values.data(), r + 1, MPI_UINT64_T, gathered.data(), counts.data(), displs.data(),
               0);
  const std::vector<std::uint64_t> everyone = coll.allgather_u64(values);
  ASSERT_EQ(everyone.size(), static_cast<std::size_t>(n) * (n + 1) / 2);
  for (int q = 0, at = 0; q < n; at += q + 1, ++q)
    for (int k = 0; k <= q; ++k) {
      EXPECT_EQ(everyone[at + k], static_cast<std::uint64_t>(q));
      if (r == 0) {
        EXPECT_EQ(gathered[at + k], static_cast<std::uint64_t>(q));
      }
    }
}

TEST(MpiCollectives, BroadcastAndExchangeOfPieces) {
  auto coll = world();
  const int r = coll.rank(), n = coll.size();
  std::string text = r == n - 1 ? std::string("from the last rank") : std::string();
  coll.broadcast(text, n - 1);
  EXPECT_EQ(text, "from the last rank");

  // Rank q owns q + 2 floats at offset (sum of the previous owners'); rank 0 none.
  std::vector<std::uint64_t> offsets(n), counts(n);
  std::uint64_t total = 0;
  for (int q = 0; q < n; ++q) {
    offsets[q] = total;
    counts[q] = q == 0 ? 0 : q + 2;
    total += counts[q];
  }
  std::vector<float> data(total, -1.0f);
  for (std::uint64_t i = 0; i < counts[r]; ++i)
    data[offsets[r] + i] = static_cast<float>(100 * r + i);
  coll.exchange_pieces(data.data(), offsets, counts, "pieces");
  for (int q = 0; q < n; ++q)
    for (std::uint64_t i = 0; i < counts[q]; ++i)
      EXPECT_EQ(data[offsets[q] + i], static_cast<float>(100 * q + i));
}

TEST(MpiCollectives, FirstFailureIsTheLowestFailingRanksMessageOnEveryRank) {
  auto coll = world();
  const int r = coll.rank(), n = coll.size();
  EXPECT_FALSE(coll.first_failure(std::nullopt).has_value());
  EXPECT_EQ(coll.count_failed(false), 0);

  // The upper half of the ranks fail (at 1 rank: rank 0), each with its own message.
  const int lowest = n / 2;
  const bool fails = r >= lowest;
  const auto f = coll.first_failure(
      fails ? std::optional<std::string>("broken on " + std::to_string(r)) : std::nullopt);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->rank, lowest);
  EXPECT_EQ(f->message, "broken on " + std::to_string(lowest));
  EXPECT_EQ(coll.count_failed(fails), n - lowest);
}

TEST(MpiCollectives, AFileReadByRankZeroReachesEveryRank) {
  const std::string path = rank0_file("deck.yaml", "run:\n  name: shared\n");
  auto coll = world();
  RootResult mine;
  if (coll.rank() == 0)
    mine = dst::runtime::attempt([&] { return dst::config::read_deck_file(path); });
  const RootResult got = coll.broadcast_result(mine, 0, "deck broadcast");
  EXPECT_TRUE(got.ok) << got.text;
  EXPECT_EQ(got.text, "run:\n  name: shared\n");
  // An empty result is a result too.
  const RootResult empty = coll.broadcast_result(RootResult{true, ""}, 0, "empty");
  EXPECT_TRUE(empty.ok);
  EXPECT_EQ(empty.text, "");
}

TEST(MpiCollectives, RankZerosFailureToReadAFileReachesEveryRank) {
  const std::string path = ::testing::TempDir() + "dst-mpi-collectives-no-such-deck.yaml";
  auto coll = world();
  RootResult mine;
  if (coll.rank() == 0)
    mine = dst::runtime::attempt([&] { return dst::config::read_deck_file(path); });
  const RootResult got = coll.broadcast_result(mine, 0, "deck broadcast");
  EXPECT_FALSE(got.ok);
  EXPECT_NE(got.text.find(path), std::string::npos) << got.text;
  EXPECT_NE(got.text.find("cannot open the deck file"), std::string::npos) << got.text;
}

TEST(MpiCollectives, OnlyTheRootsResultCounts) {
  auto coll = world();
  const int root = coll.size() - 1;
  // Every rank passes something; the others' values are ignored.
  const RootResult got = coll.broadcast_result(
      RootResult{coll.rank() != root, "rank " + std::to_string(coll.rank())}, root, "result");
  EXPECT_FALSE(got.ok);
  EXPECT_EQ(got.text, "rank " + std::to_string(root));
}

}  // namespace
