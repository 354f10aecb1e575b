// TokenRows (model/layers/token_rows.hpp), the block's communication pattern, on 1, 2 and
// 4 ranks over the world as a tensor group: a rank's rows (sequence parallelism) against
// whole rows on one rank, for a split part (each rank a slice W_r of W = sum_r W_r, its
// output a partial sum) and a replicated part (W whole on every rank), forward and
// backward through a real RmsNorm. The part is a product with small integers, so its
// sums are exact in any order: the activations and input gradients must be whole rows'
// bits; the norm weight's gradient, a sum over rows whose order the split changes, within
// 1e-6 relative.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "comm/mpi_communicator.hpp"
#include "core/error.hpp"
#include "model/layers/rmsnorm.hpp"
#include "model/layers/tensor_parallel.hpp"
#include "model/layers/token_rows.hpp"
#include "model/param_store.hpp"
#include "mpi_world.hpp"

namespace {

using dst::model::Compute;
using dst::model::Part;
using dst::model::RmsNorm;
using dst::model::RmsNormActs;
using dst::model::RowBuffers;
using dst::model::TensorParallel;
using dst::model::TokenRows;
using dst::tensor::Shape;
using dst::tensor::Tensor;
using dst::test::world_rank;
using dst::test::world_size;

constexpr std::int64_t kC = 4;  // the width of the rows

Tensor view(std::vector<float>& v, Shape s) {
  return Tensor{v.data(), s, dst::DType::f32, dst::tensor::Device::host};
}

/// Rank r's slice of the part's (C, C) weight, small integers; W is their sum.
std::vector<float> slice_weight(int r) {
  std::vector<float> w(kC * kC);
  for (std::int64_t i = 0; i < kC * kC; ++i)
    w[static_cast<std::size_t>(i)] = static_cast<float>((i * 7 + r * 3) % 5 - 2);
  return w;
}

std::vector<float> whole_weight(int ranks) {
  std::vector<float> w(kC * kC, 0.0f);
  for (int r = 0; r < ranks; ++r) {
    const std::vector<float> s = slice_weight(r);
    for (std::size_t i = 0; i < w.size(); ++i)
      w[i] += s[i];
  }
  return w;
}

/// out (n, C) = in (n, C) W, or in W^T with `transposed` (the product's input gradient).
void product(const Tensor& in, const std::vector<float>& w, const Tensor& out, bool transposed) {
  const std::int64_t n = in.shape[0];
  const float* x = in.ptr<float>();
  float* y = out.ptr<float>();
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < kC; ++j) {
      float s = 0.0f;
      for (std::int64_t k = 0; k < kC; ++k)
        s += x[i * kC + k] * w[static_cast<std::size_t>(transposed ? j * kC + k : k * kC + j)];
      y[i * kC + j] = s;
    }
}

/// Every rank's data: x (N, C) the residual stream, entries +-2 (so that with eps 0 a row's
/// rms is 2 and the norm's output is +-1 times its weight: exact), and dout (N, C) the
/// part's output gradient, small integers.
struct Rows {
  std::int64_t n;
  std::vector<float> x, dout;
  explicit Rows(std::int64_t rows) : n(rows), x(rows * kC), dout(rows * kC) {
    for (std::int64_t i = 0; i < rows * kC; ++i) {
      x[static_cast<std::size_t>(i)] = (i * 7 + i / kC) % 5 < 2 ? -2.0f : 2.0f;
      dout[static_cast<std::size_t>(i)] = static_cast<float>((i * 3) % 7 - 3);
    }
  }
};

struct Fixture {
  dst::comm::MpiCommunicator comm{MPI_COMM_WORLD, "tensor", 30.0};
  TensorParallel tp{comm};
  RmsNorm norm{"norm.weight", kC, 0.0f};
  std::unique_ptr<dst::model::ParamStore> params;
  Fixture() {
    std::vector<dst::model::ParamSpec> specs;
    norm.declare(specs);
    params = std::make_unique<dst::model::ParamStore>(specs, dst::tensor::Arena::Mode::allocate);
    float* g = params->params_data();
    for (std::int64_t j = 0; j < kC; ++j)
      g[j] = 0.75f + 0.25f * static_cast<float>(j);
    norm.bind(*params);
  }
  Compute context(bool with_group) {
    Compute c;
    c.params = params.get();
    c.tensor = with_group ? &tp : nullptr;
    return c;
  }
};

/// What one pass gives: the part's output rows, the residual gradient rows and the norm
/// weight's gradient.
struct Result {
  std::vector<float> out, d_x, d_weight;
};

/// Forward and backward of a part behind `norm` over `rows` of `data` (the rank's rows
/// under `split` > 1, every row otherwise): run_part computes the part from the rows it
/// reads, in the context the pattern gives it.
Result pass(Fixture& f, const Rows& data, int split, Part part) {
  const TokenRows pattern(split);
  const std::int64_t n = data.n, r = pattern.rows(n);
  const std::int64_t first = split == 1 ? 0 : world_rank() * r;
  std::vector<float> x(data.x.begin() + first * kC, data.x.begin() + (first + r) * kC);
  std::vector<float> d_x(data.dout.begin() + first * kC, data.dout.begin() + (first + r) * kC);
  std::vector<float> norm_out(r * kC), rstd(r), out(r * kC, -1.0f);
  std::vector<float> gathered(n * kC), partial(n * kC), d_ln(n * kC), d_norm(kC);
  const RowBuffers buf{split == 1 ? Tensor{} : view(gathered, {n, kC}),
                       split == 1 ? Tensor{} : view(partial, {n, kC}), view(d_norm, {kC})};
  const RmsNormActs acts{view(norm_out, {r, kC}), view(rstd, {r})};
  const Compute c = f.context(split > 1);
  f.params->zero_grads();
  f.norm.forward(c, view(x, {r, kC}), acts);
  const std::vector<float> w = part == Part::replicated || split == 1 ? whole_weight(world_size())
                                                                      : slice_weight(world_rank());
  pattern.forward(c, part, acts.out, buf, view(out, {r, kC}),
                  [&](const Compute& pc, const Tensor& in, const Tensor& o) {
                    EXPECT_EQ(in.shape[0], n) << "the part reads every row";
                    if (part == Part::replicated) EXPECT_EQ(pc.tensor, nullptr);
                    if (part == Part::split && split > 1) EXPECT_TRUE(pc.keep_partial);
                    product(in, w, o, false);
                  });
  pattern.backward(c, part, f.norm, view(x, {r, kC}), acts, buf, view(d_ln, {n, kC}),
                   view(d_x, {r, kC}), [&](const Compute&, const Tensor& dout, const Tensor& in) {
                     EXPECT_EQ(dout.shape[0], n);
                     EXPECT_EQ(in.shape[0], n);
                     product(dout, w, view(d_ln, {n, kC}), true);
                   });
  const float* g = f.params->grads_data();
  return {out, d_x, std::vector<float>(g, g + kC)};
}

void expect_rows_of_whole(Part part) {
  Fixture f;
  const std::int64_t n = 3 * world_size();
  const Rows data(n);
  const Result whole = pass(f, data, 1, part);
  const Result mine = pass(f, data, world_size(), part);
  const std::size_t at = static_cast<std::size_t>(world_rank() * 3 * kC);
  ASSERT_EQ(mine.out.size(), static_cast<std::size_t>(3 * kC));
  EXPECT_EQ(0, std::memcmp(mine.out.data(), whole.out.data() + at, mine.out.size() * 4))
      << "forward rows";
  EXPECT_EQ(0, std::memcmp(mine.d_x.data(), whole.d_x.data() + at, mine.d_x.size() * 4))
      << "the residual gradient's rows";
  for (std::int64_t j = 0; j < kC; ++j)
    EXPECT_NEAR(mine.d_weight[j], whole.d_weight[j], 1e-6 * std::fabs(whole.d_weight[j]))
        << "the norm weight's gradient, summed over the group, column " << j;
}

TEST(TokenRows, SplitPartGivesEachRankItsRowsOfWholeRows) {
  expect_rows_of_whole(Part::split);
}

TEST(TokenRows, ReplicatedPartGivesEachRankItsRowsOfWholeRows) {
  expect_rows_of_whole(Part::replicated);
}

TEST(TokenRows, ARanksRowsNeedTheirGroup) {
  Fixture f;
  const TokenRows pattern(2);
  std::vector<float> a(8), b(4);
  const RowBuffers buf{view(a, {2, kC}), view(a, {2, kC}), {}};
  const Compute without = f.context(false);
  EXPECT_THROW(pattern.forward(without, Part::split, view(b, {1, kC}), buf, view(b, {1, kC}),
                               [](const Compute&, const Tensor&, const Tensor&) {}),
               dst::Error);
  EXPECT_THROW(TokenRows(0), dst::Error);
}

}  // namespace
