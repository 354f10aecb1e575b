// TensorParallel's row-split collectives (model/layers/tensor_parallel.hpp), the ones
// sequence parallelism needs, on 1, 2 and 4 ranks over the world as a tensor group:
// all_gather stacks every rank's rows by rank, reduce_scatter leaves each rank its share
// of the sum (small integers, so exact whatever the summation order), both count half an
// all-reduce's volume in the group's traffic, and shapes that do not split are named
// before any communication.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <vector>

#include "comm/mpi_communicator.hpp"
#include "core/error.hpp"
#include "model/layers/tensor_parallel.hpp"
#include "mpi_world.hpp"

namespace {

using dst::model::TensorParallel;
using dst::tensor::Shape;
using dst::tensor::Tensor;
using dst::test::world_rank;
using dst::test::world_size;

constexpr std::int64_t kRows = 3, kWidth = 5;  // one rank's share of the rows

Tensor view(std::vector<float>& v, Shape s) {
  return Tensor{v.data(), s, dst::DType::f32, dst::tensor::Device::host};
}

/// A value that names its rank, row and column, exact in f32.
float mark(int rank, std::int64_t row, std::int64_t column) {
  return static_cast<float>(rank * 1000 + row * 10 + column);
}

struct Group {
  dst::comm::MpiCommunicator comm{MPI_COMM_WORLD, "tensor", 30.0};
  TensorParallel tp{comm};
};

TEST(TensorParallelRows, AllGatherStacksEveryRanksRowsByRank) {
  Group g;
  const int size = world_size();
  std::vector<float> local(kRows * kWidth), whole(size * kRows * kWidth, -1.0f);
  for (std::int64_t i = 0; i < kRows; ++i)
    for (std::int64_t j = 0; j < kWidth; ++j)
      local[i * kWidth + j] = mark(world_rank(), i, j);
  g.tp.all_gather(view(local, {kRows, kWidth}), view(whole, {size * kRows, kWidth}));
  for (int r = 0; r < size; ++r)
    for (std::int64_t i = 0; i < kRows; ++i)
      for (std::int64_t j = 0; j < kWidth; ++j)
        ASSERT_EQ(whole[(r * kRows + i) * kWidth + j], mark(r, i, j))
            << "rank " << r << " row " << i << " column " << j;
}

TEST(TensorParallelRows, ReduceScatterLeavesEachRankItsShareOfTheSum) {
  Group g;
  const int size = world_size(), rank = world_rank();
  const std::int64_t rows = size * kRows;
  std::vector<float> whole(rows * kWidth), local(kRows * kWidth, -1.0f);
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < kWidth; ++j)
      whole[i * kWidth + j] = mark(rank, i, j);
  g.tp.reduce_scatter(view(whole, {rows, kWidth}), view(local, {kRows, kWidth}));
  for (std::int64_t i = 0; i < kRows; ++i)
    for (std::int64_t j = 0; j < kWidth; ++j) {
      float sum = 0.0f;
      for (int r = 0; r < size; ++r)
        sum += mark(r, rank * kRows + i, j);
      ASSERT_EQ(local[i * kWidth + j], sum) << "row " << i << " column " << j;
    }
}

TEST(TensorParallelRows, ReduceScatterAndAllGatherCountOneAllReducesVolume) {
  Group g;
  const int size = world_size();
  const std::int64_t rows = size * kRows;
  std::vector<float> whole(rows * kWidth, 1.0f), local(kRows * kWidth);
  g.tp.all_reduce(view(whole, {rows, kWidth}));
  const auto all_reduce_bytes = g.tp.traffic().bytes;
  EXPECT_EQ(all_reduce_bytes, rows * kWidth * sizeof(float));
  g.tp.reset_traffic();
  g.tp.reduce_scatter(view(whole, {rows, kWidth}), view(local, {kRows, kWidth}));
  g.tp.all_gather(view(local, {kRows, kWidth}), view(whole, {rows, kWidth}));
  EXPECT_EQ(g.tp.traffic().bytes, all_reduce_bytes);
  EXPECT_EQ(g.tp.traffic().calls, 2);
  EXPECT_GE(g.tp.traffic().seconds, 0.0);
}

// Every rank throws alike before communicating, so the group stays in step.
TEST(TensorParallelRows, RefusesShapesThatDoNotSplitBeforeCommunicating) {
  Group g;
  const int size = world_size();
  std::vector<float> whole((size * kRows + 1) * kWidth), local(kRows * kWidth);
  std::vector<std::int32_t> ids(kRows * kWidth);
  // One share too many rows in the local tensor.
  EXPECT_THROW(
      g.tp.all_gather(view(whole, {kRows + 1, kWidth}), view(whole, {size * kRows, kWidth})),
      dst::Error);
  // Another width.
  EXPECT_THROW(
      g.tp.reduce_scatter(view(whole, {size * kRows, kWidth}), view(local, {kRows, kWidth - 1})),
      dst::Error);
  // Not f32.
  EXPECT_THROW(g.tp.all_gather(
                   Tensor{ids.data(), {kRows, kWidth}, dst::DType::i32, dst::tensor::Device::host},
                   view(whole, {size * kRows, kWidth})),
               dst::Error);
  if (size > 1) {  // rows the group size does not divide
    EXPECT_THROW(
        g.tp.reduce_scatter(view(whole, {size * kRows + 1, kWidth}), view(local, {kRows, kWidth})),
        dst::Error);
  }
  EXPECT_EQ(g.tp.traffic().calls, 0);
  g.comm.barrier();
}

}  // namespace
