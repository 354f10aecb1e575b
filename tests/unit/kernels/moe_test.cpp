// DeepSeekMoE's token movement (gather_rows, its transpose, the weighted combine and its
// backward) against plain double references over a routing made like the router's:
// rows sorted by expert, with an expert that gets no token and one that gets many;
// gradients of the combine against finite differences; shape errors.
#include <algorithm>
#include <numeric>

#include "kernels_test_util.hpp"

namespace dst::kernels::test {
namespace {

/// A routing of N tokens over E experts, K slots each (distinct experts per token),
/// sorted by expert like model/layers/moe_router.cpp's sort_by_expert: token (R) is the
/// token of each row, row (N, K) the row of token n's slot k. Expert 1 gets no token;
/// expert 0 gets every token's slot 0.
struct Routing {
  std::int64_t n, k;
  std::vector<std::int32_t> token, row;
};

Routing make_routing(std::int64_t n, std::int64_t k, std::int64_t experts) {
  Routing r{n, k, {}, {}};
  std::vector<std::int32_t> idx(static_cast<std::size_t>(n * k));
  for (std::int64_t t = 0; t < n; ++t)
    for (std::int64_t s = 0; s < k; ++s)  // slot 0: expert 0; others among 2 .. E-1
      idx[static_cast<std::size_t>(t * k + s)] =
          s == 0 ? 0 : static_cast<std::int32_t>(2 + (t * 7 + s * 3) % (experts - 2));
  for (std::int64_t t = 0; t < n; ++t)  // distinct experts per token
    for (std::int64_t s = 2; s < k; ++s)
      while (std::find(idx.begin() + t * k, idx.begin() + t * k + s,
                       idx[static_cast<std::size_t>(t * k + s)]) != idx.begin() + t * k + s)
        idx[static_cast<std::size_t>(t * k + s)] = static_cast<std::int32_t>(
            2 + (idx[static_cast<std::size_t>(t * k + s)] - 1) % (experts - 2));
  std::vector<std::int64_t> order(idx.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
    return idx[static_cast<std::size_t>(a)] < idx[static_cast<std::size_t>(b)];
  });
  r.token.resize(idx.size());
  r.row.resize(idx.size());
  for (std::size_t p = 0; p < order.size(); ++p) {
    r.token[p] = static_cast<std::int32_t>(order[p] / k);
    r.row[static_cast<std::size_t>(order[p])] = static_cast<std::int32_t>(p);
  }
  return r;
}

TEST(MoeKernels, GatherRowsCopiesEachRowsToken) {
  const std::int64_t n = 7, k = 3, c = 13;
  Routing r = make_routing(n, k, 6);
  auto x = random_vec(static_cast<std::size_t>(n * c), 1);
  std::vector<float> out(static_cast<std::size_t>(n * k * c), -1.0f);
  gather_rows(kokkos_ctx(), view(x, {n, c}), view(r.token, {n * k}), view(out, {n * k, c}));
  for (std::int64_t p = 0; p < n * k; ++p)
    for (std::int64_t j = 0; j < c; ++j)
      ASSERT_EQ(out[static_cast<std::size_t>(p * c + j)],
                x[static_cast<std::size_t>(r.token[static_cast<std::size_t>(p)] * c + j)])
          << "row " << p << " column " << j;
}

// gather_rows is the embedding's checked gather: a token outside x's rows is named with its
// position, and nothing is written.
TEST(MoeKernels, GatherRowsRefusesATokenOutsideTheRows) {
  const std::int64_t n = 3, c = 4;
  auto x = random_vec(static_cast<std::size_t>(n * c), 1);
  std::vector<std::int32_t> token{0, 2, 3, 1};
  std::vector<float> out(static_cast<std::size_t>(4 * c), -1.0f);
  expect_error(
      [&] {
        gather_rows(kokkos_ctx(), view(x, {n, c}), view(token, {4}), view(out, {4, c}));
      },
      {"kernels::gather_rows: token id 3 at position 2 is outside the rows of x [0, 3)"});
  for (const float v : out)
    EXPECT_EQ(v, -1.0f);
}

TEST(MoeKernels, GatherRowsBackwardIsTheTransposeAndAccumulates) {
  const std::int64_t n = 9, k = 2, c = 10;
  Routing r = make_routing(n, k, 5);
  auto d_out = random_vec(static_cast<std::size_t>(n * k * c), 2);
  auto dx = random_vec(static_cast<std::size_t>(n * c), 3);
  std::vector<double> expected(dx.begin(), dx.end());
  for (std::int64_t t = 0; t < n; ++t)
    for (std::int64_t s = 0; s < k; ++s)
      for (std::int64_t j = 0; j < c; ++j)
        expected[static_cast<std::size_t>(t * c + j)] +=
            d_out[static_cast<std::size_t>(r.row[static_cast<std::size_t>(t * k + s)] * c + j)];
  gather_rows_backward(kokkos_ctx(), view(d_out, {n * k, c}), view(r.row, {n, k}),
                       view(dx, {n, c}));
  // K + 1 float terms per element in slot order: a few ulp.
  expect_close(dx, expected, 1e-6, 1e-6, "dx");
  // Adjoint: <gather(x), g> == <x, gather^T(g)> (dx started at zero).
  auto x = random_vec(static_cast<std::size_t>(n * c), 4);
  std::vector<float> gx(static_cast<std::size_t>(n * k * c)), gt(x.size(), 0.0f);
  gather_rows(kokkos_ctx(), view(x, {n, c}), view(r.token, {n * k}), view(gx, {n * k, c}));
  gather_rows_backward(kokkos_ctx(), view(d_out, {n * k, c}), view(r.row, {n, k}),
                       view(gt, {n, c}));
  double lhs = 0.0, rhs = 0.0;
  for (std::size_t i = 0; i < gx.size(); ++i)
    lhs += static_cast<double>(gx[i]) * d_out[i];
  for (std::size_t i = 0; i < x.size(); ++i)
    rhs += static_cast<double>(x[i]) * gt[i];
  EXPECT_NEAR(lhs, rhs, 1e-5 * std::abs(lhs) + 1e-6);
}

/// out[n] + sum_k w[n, k] y[row[n, k]] in double.
std::vector<double> combine_ref(const Routing& r, std::int64_t c, const std::vector<double>& y,
                                const std::vector<double>& w, const std::vector<float>& out0) {
  std::vector<double> out(out0.begin(), out0.end());
  for (std::int64_t t = 0; t < r.n; ++t)
    for (std::int64_t s = 0; s < r.k; ++s)
      for (std::int64_t j = 0; j < c; ++j)
        out[static_cast<std::size_t>(t * c + j)] +=
            w[static_cast<std::size_t>(t * r.k + s)] *
            y[static_cast<std::size_t>(r.row[static_cast<std::size_t>(t * r.k + s)] * c + j)];
  return out;
}

TEST(MoeKernels, CombineForwardAddsTheWeightedExpertRows) {
  const std::int64_t n = 8, k = 3, c = 17;
  Routing r = make_routing(n, k, 7);
  auto y = random_vec(static_cast<std::size_t>(n * k * c), 5);
  auto w = random_vec(static_cast<std::size_t>(n * k), 6, 0.0f, 1.0f);
  auto out = random_vec(static_cast<std::size_t>(n * c), 7);  // the shared experts' output
  const auto expected = combine_ref(r, c, to_double(y), to_double(w), out);
  moe_combine_forward(kokkos_ctx(), view(y, {n * k, c}), view(r.row, {n, k}), view(w, {n, k}),
                      view(out, {n, c}));
  expect_close(out, expected, 1e-6, 1e-6, "out");
}

TEST(MoeKernels, CombineBackwardMatchesFiniteDifferences) {
  const std::int64_t n = 5, k = 2, c = 6;
  Routing r = make_routing(n, k, 4);
  auto y = random_vec(static_cast<std::size_t>(n * k * c), 8);
  auto w = random_vec(static_cast<std::size_t>(n * k), 9, 0.0f, 1.0f);
  auto dout = random_vec(static_cast<std::size_t>(n * c), 10);
  std::vector<float> d_y(y.size(), 99.0f), d_w(w.size(), 99.0f);  // written, not accumulated
  moe_combine_backward(kokkos_ctx(), view(dout, {n, c}), view(y, {n * k, c}), view(r.row, {n, k}),
                       view(w, {n, k}), view(d_y, {n * k, c}), view(d_w, {n, k}));
  const std::vector<float> zero(static_cast<std::size_t>(n * c), 0.0f);
  const auto yd = to_double(y), wd = to_double(w);
  const auto gy = fd_gradient(yd, [&](const std::vector<double>& v) {
    return weighted_sum(combine_ref(r, c, v, wd, zero), dout);
  });
  const auto gw = fd_gradient(wd, [&](const std::vector<double>& v) {
    return weighted_sum(combine_ref(r, c, yd, v, zero), dout);
  });
  expect_close(d_y, gy, 1e-6, 1e-5, "d_y");
  expect_close(d_w, gw, 1e-6, 1e-5, "d_weights");
}

TEST(MoeKernels, ShapeErrorsNameTheKernelAndTensor) {
  const std::int64_t n = 4, k = 2, c = 3;
  Routing r = make_routing(n, k, 4);
  std::vector<float> x(static_cast<std::size_t>(n * k * c)), y(x.size()),
      w(static_cast<std::size_t>(n * k));
  std::vector<float> out(x.size());
  // out's columns differ from x's.
  expect_error(
      [&] {
        gather_rows(kokkos_ctx(), view(x, {n, c}), view(r.token, {n * k}),
                    view(out, {n * k, c - 1}));
      },
      {"kernels::gather_rows: out"});
  // row (N, K) names N*K rows, y has fewer.
  expect_error(
      [&] {
        moe_combine_forward(kokkos_ctx(), view(y, {n * k - 1, c}), view(r.row, {n, k}),
                            view(w, {n, k}), view(out, {n, c}));
      },
      {"kernels::moe_combine_forward: row", "names 8 rows, y has 7"});
  // Indices must be i32.
  std::vector<float> bad_row(static_cast<std::size_t>(n * k));
  expect_error(
      [&] {
        gather_rows_backward(kokkos_ctx(), view(y, {n * k, c}), view(bad_row, {n, k}),
                             view(out, {n, c}));
      },
      {"kernels::gather_rows_backward: row", "i32"});
}

}  // namespace
}  // namespace dst::kernels::test
