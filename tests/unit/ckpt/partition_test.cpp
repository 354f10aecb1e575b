// Who writes, reads and hashes what: every row exactly once, shares balanced.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "ckpt/detail/partition.hpp"

namespace {

using namespace dst::ckpt::detail;

TEST(Partition, SplitPointIsExactWithoutOverflow) {
  EXPECT_EQ(split_point(10, 0, 3), 0u);
  EXPECT_EQ(split_point(10, 1, 3), 3u);
  EXPECT_EQ(split_point(10, 2, 3), 6u);
  EXPECT_EQ(split_point(10, 3, 3), 10u);
  // total * part overflows 64 bits here; the split does not.
  const std::uint64_t big = (std::uint64_t{1} << 62) + 12345;
  EXPECT_EQ(split_point(big, 1000, 1000), big);
  EXPECT_EQ(split_point(big, 500, 1000), big / 2);
}

TEST(Partition, WriteRowsCoverEveryRowOnceAndBalance) {
  // Tensors of a small model: (rows, row elements).
  const std::vector<std::vector<std::int64_t>> shapes = {{1000, 64}, {64},      {},  {0, 5},
                                                         {7, 3, 2},  {333, 64}, {1}, {64, 1000}};
  std::uint64_t total = 0;
  std::uint64_t widest_row = 1;
  for (const auto& s : shapes) {
    const auto rs = row_shape(s);
    total += rs.rows * rs.row_elements;
    widest_row = std::max(widest_row, rs.row_elements);
  }
  for (int size : {1, 2, 3, 4, 7}) {
    std::vector<std::uint64_t> per_rank(size, 0);
    std::uint64_t offset = 0;
    for (const auto& s : shapes) {
      const auto rs = row_shape(s);
      std::uint64_t next = 0;  // ranks' ranges meet exactly, in rank order
      for (int r = 0; r < size; ++r) {
        const auto rows = write_rows(offset, rs, total, r, size);
        ASSERT_EQ(rows.begin, next) << "size " << size << " rank " << r;
        ASSERT_LE(rows.begin, rows.end);
        next = rows.end;
        per_rank[r] += rows.rows() * rs.row_elements;
      }
      EXPECT_EQ(next, rs.rows * rs.row_elements == 0 ? next : rs.rows);
      offset += rs.rows * rs.row_elements;
    }
    EXPECT_EQ(std::accumulate(per_rank.begin(), per_rank.end(), std::uint64_t{0}), total);
    // Each rank's share is within one row per boundary of total/size.
    for (int r = 0; r < size; ++r)
      EXPECT_NEAR(static_cast<double>(per_rank[r]), static_cast<double>(total) / size,
                  2.0 * widest_row)
          << "size " << size << " rank " << r;
  }
}

TEST(Partition, ScalarTensorHasOneRow) {
  const auto rs = row_shape({});
  EXPECT_EQ(rs.rows, 1u);
  EXPECT_EQ(rs.row_elements, 1u);
}

TEST(Partition, PiecesRespectTheLimitAndKeepWholeRows) {
  const RowShape rs{100, 30};
  const auto p = pieces({10, 95}, rs, 100);  // 3 rows (90 elements) per piece
  ASSERT_EQ(p.size(), 29u);
  EXPECT_EQ(p.front().begin, 10u);
  EXPECT_EQ(p.front().end, 13u);
  EXPECT_EQ(p.back().end, 95u);
  for (std::size_t i = 1; i < p.size(); ++i)
    EXPECT_EQ(p[i].begin, p[i - 1].end);
  // A row wider than the limit still goes whole, one per piece.
  EXPECT_EQ(pieces({0, 4}, RowShape{4, 500}, 100).size(), 4u);
  EXPECT_TRUE(pieces({5, 5}, rs, 100).empty());
}

TEST(Partition, ReadRowsAndBlockSharesCoverAll) {
  for (int size : {1, 2, 4, 5}) {
    std::uint64_t next = 0, next_block = 0;
    for (int r = 0; r < size; ++r) {
      const auto rows = read_rows(RowShape{10, 8}, r, size);
      EXPECT_EQ(rows.begin, next);
      next = rows.end;
      const auto blocks = block_share(3, r, size);
      EXPECT_EQ(blocks.begin, next_block);
      next_block = blocks.end;
    }
    EXPECT_EQ(next, 10u);
    EXPECT_EQ(next_block, 3u);
  }
}

}  // namespace
