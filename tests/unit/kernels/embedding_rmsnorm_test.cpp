// Embedding and RMSNorm against plain double references; gradients against finite
// differences of those references.
#include <cmath>

#include "kernels_test_util.hpp"

namespace dst::kernels::test {
namespace {

// --- embedding -------------------------------------------------------------------------

TEST(Embedding, ForwardGathersRowsOddShapes) {
  // V = 259 (not a multiple of 8), C = 7 (odd), tokens (B, T) = (2, 3) with a repeat.
  const std::int64_t v = 259, c = 7;
  std::vector<std::int32_t> tok{0, 258, 17, 17, 3, 128};
  auto wte = random_vec(static_cast<std::size_t>(v * c), 1);
  std::vector<float> out(tok.size() * c, -1.0f);
  embedding_forward(kokkos_ctx(), view(tok, {2, 3}), view(wte, {v, c}), view(out, {2, 3, c}));
  // Pure data movement: bitwise.
  for (std::size_t n = 0; n < tok.size(); ++n)
    for (std::int64_t j = 0; j < c; ++j)
      ASSERT_EQ(out[n * c + j], wte[static_cast<std::size_t>(tok[n] * c + j)]) << n << "," << j;
}

TEST(Embedding, BackwardAccumulatesRepeatedTokens) {
  const std::int64_t v = 11, c = 13, n_tok = 9;
  std::vector<std::int32_t> tok{4, 1, 4, 10, 0, 4, 1, 7, 10};
  auto dout = random_vec(static_cast<std::size_t>(n_tok * c), 2);
  auto dwte = random_vec(static_cast<std::size_t>(v * c), 3);  // accumulates onto this
  std::vector<double> ref = to_double(dwte);
  for (std::int64_t n = 0; n < n_tok; ++n)
    for (std::int64_t j = 0; j < c; ++j)
      ref[tok[n] * c + j] += dout[n * c + j];
  embedding_backward(kokkos_ctx(), view(tok, {n_tok}), view(dout, {n_tok, c}), view(dwte, {v, c}));
  // At most 4 float additions per element (token 4 appears 3 times): 4 roundings of
  // values below 4 in magnitude.
  expect_close(dwte, ref, 4 * 4 * 6e-8, 0, "dwte");
}

TEST(Embedding, BackwardIsDeterministicAcrossColumnBlocks) {
  // C = 200 spans several column blocks; many repeats of few tokens.
  const std::int64_t v = 5, c = 200, n_tok = 300;
  std::vector<std::int32_t> tok(static_cast<std::size_t>(n_tok));
  for (std::int64_t n = 0; n < n_tok; ++n)
    tok[n] = static_cast<std::int32_t>((n * 7) % v);
  auto dout = random_vec(static_cast<std::size_t>(n_tok * c), 4);
  std::vector<float> a(static_cast<std::size_t>(v * c), 0.0f), b = a;
  embedding_backward(kokkos_ctx(), view(tok, {n_tok}), view(dout, {n_tok, c}), view(a, {v, c}));
  embedding_backward(kokkos_ctx(), view(tok, {n_tok}), view(dout, {n_tok, c}), view(b, {v, c}));
  expect_bitwise(a, b, "dwte");
}

TEST(Embedding, BadTokenIdThrowsWithIdAndPosition) {
  const std::int64_t v = 259, c = 4;
  auto wte = random_vec(static_cast<std::size_t>(v * c), 5);
  std::vector<float> out(4 * c);
  std::vector<std::int32_t> tok{1, 2, 3, 259};
  expect_error(
      [&] {
        embedding_forward(kokkos_ctx(), view(tok, {4}), view(wte, {v, c}), view(out, {4, c}));
      },
      {"embedding_forward", "token id 259", "position 3", "[0, 259)"});
  tok = {1, -1, 3, -7};
  expect_error(
      [&] {
        embedding_backward(kokkos_ctx(), view(tok, {4}), view(out, {4, c}), view(wte, {v, c}));
      },
      {"embedding_backward", "token id -1", "position 1"});
}

// --- RMSNorm ---------------------------------------------------------------------------

struct RmsRef {
  std::vector<double> out, rstd;
};

RmsRef rmsnorm_ref(const std::vector<double>& x, const std::vector<double>& w, double eps,
                   std::int64_t n_rows, std::int64_t c) {
  RmsRef r{std::vector<double>(x.size()), std::vector<double>(static_cast<std::size_t>(n_rows))};
  for (std::int64_t n = 0; n < n_rows; ++n) {
    double ss = 0;
    for (std::int64_t j = 0; j < c; ++j)
      ss += x[n * c + j] * x[n * c + j];
    const double rs = 1.0 / std::sqrt(ss / c + eps);
    r.rstd[n] = rs;
    for (std::int64_t j = 0; j < c; ++j)
      r.out[n * c + j] = x[n * c + j] * rs * w[j];
  }
  return r;
}

void check_rmsnorm_forward(std::int64_t b, std::int64_t t, std::int64_t c, std::uint32_t seed) {
  const std::int64_t n = b * t;
  const float eps = 1e-5f;
  auto x = random_vec(static_cast<std::size_t>(n * c), seed, -2.0f, 2.0f);
  auto w = random_vec(static_cast<std::size_t>(c), seed + 1, 0.5f, 1.5f);
  std::vector<float> out(x.size()), rstd(static_cast<std::size_t>(n));
  rmsnorm_forward(kokkos_ctx(), view(x, {b, t, c}), view(w, {c}), eps, view(out, {b, t, c}),
                  view(rstd, {b, t}));
  const auto ref = rmsnorm_ref(to_double(x), to_double(w), eps, n, c);
  // rstd: double sum, one rounding to float (6e-8 relative); out: two more float products.
  expect_close(rstd, ref.rstd, 0, 2e-7, "rstd");
  expect_close(out, ref.out, 1e-7, 5e-7, "out");
}

TEST(RmsNorm, ForwardMatchesReference) {
  check_rmsnorm_forward(2, 3, 7, 10);   // odd C, (B, T, C) input
  check_rmsnorm_forward(1, 1, 13, 11);  // one row
  check_rmsnorm_forward(4, 8, 256, 12);
}

void check_rmsnorm_backward(std::int64_t n, std::int64_t c, std::uint32_t seed) {
  const float eps = 1e-5f;
  auto x = random_vec(static_cast<std::size_t>(n * c), seed, -2.0f, 2.0f);
  auto w = random_vec(static_cast<std::size_t>(c), seed + 1, 0.5f, 1.5f);
  auto r = random_vec(x.size(), seed + 2);  // dout
  std::vector<float> out(x.size()), rstd(static_cast<std::size_t>(n));
  rmsnorm_forward(kokkos_ctx(), view(x, {n, c}), view(w, {c}), eps, view(out, {n, c}),
                  view(rstd, {n}));
  auto dx = random_vec(x.size(), seed + 3);  // accumulates onto these
  auto dw = random_vec(w.size(), seed + 4);
  const auto dx0 = to_double(dx), dw0 = to_double(dw);
  rmsnorm_backward(kokkos_ctx(), view(r, {n, c}), view(x, {n, c}), view(w, {c}), view(rstd, {n}),
                   view(dx, {n, c}), view(dw, {c}));

  const auto xd = to_double(x), wd = to_double(w);
  auto gx = fd_gradient(xd, [&](const std::vector<double>& xv) {
    return weighted_sum(rmsnorm_ref(xv, wd, eps, n, c).out, r);
  });
  auto gw = fd_gradient(wd, [&](const std::vector<double>& wv) {
    return weighted_sum(rmsnorm_ref(xd, wv, eps, n, c).out, r);
  });
  for (std::size_t i = 0; i < gx.size(); ++i)
    gx[i] += dx0[i];
  for (std::size_t i = 0; i < gw.size(); ++i)
    gw[i] += dw0[i];
  // dx = rstd * (g - xhat * mean(g xhat)) cancels between terms of size ~|g| ~ 1.5 (rstd
  // ~ 1): a few float roundings of those, 1e-6 absolute; dw sums n products in double.
  expect_close(dx, gx, 2e-6, 1e-5, "dx");
  expect_close(dw, gw, 2e-6 * static_cast<double>(n), 1e-5, "dw");
}

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  check_rmsnorm_backward(4, 7, 20);
  check_rmsnorm_backward(1, 13, 21);
  check_rmsnorm_backward(3, 70, 22);  // C > one column block (64) on host
}

TEST(RmsNorm, BackwardIsDeterministic) {
  const std::int64_t n = 64, c = 130;
  auto x = random_vec(static_cast<std::size_t>(n * c), 30);
  auto w = random_vec(static_cast<std::size_t>(c), 31);
  auto g = random_vec(x.size(), 32);
  std::vector<float> out(x.size()), rstd(static_cast<std::size_t>(n));
  rmsnorm_forward(kokkos_ctx(), view(x, {n, c}), view(w, {c}), 1e-6f, view(out, {n, c}),
                  view(rstd, {n}));
  std::vector<float> dx1(x.size(), 0.f), dw1(w.size(), 0.f), dx2 = dx1, dw2 = dw1;
  rmsnorm_backward(kokkos_ctx(), view(g, {n, c}), view(x, {n, c}), view(w, {c}), view(rstd, {n}),
                   view(dx1, {n, c}), view(dw1, {c}));
  rmsnorm_backward(kokkos_ctx(), view(g, {n, c}), view(x, {n, c}), view(w, {c}), view(rstd, {n}),
                   view(dx2, {n, c}), view(dw2, {c}));
  expect_bitwise(dx1, dx2, "dx");
  expect_bitwise(dw1, dw2, "dw");
}

// The weight gradient's arithmetic, exactly: each column sums float(dout * float(x * rstd))
// over rows 0..N-1 in order, in double, and adds the rounded sum to dw. That holds on the
// host's one-pass path (C up to 4096) and on its two-pass one (wider rows), so both give
// these bits, and a 4096-wide row gives what a 4100-wide one's first columns would.
void check_rmsnorm_dw_bits(std::int64_t n, std::int64_t c, std::uint32_t seed) {
  auto x = random_vec(static_cast<std::size_t>(n * c), seed, -2.0f, 2.0f);
  auto w = random_vec(static_cast<std::size_t>(c), seed + 1, 0.5f, 1.5f);
  auto g = random_vec(x.size(), seed + 2);
  std::vector<float> out(x.size()), rstd(static_cast<std::size_t>(n));
  rmsnorm_forward(kokkos_ctx(), view(x, {n, c}), view(w, {c}), 1e-6f, view(out, {n, c}),
                  view(rstd, {n}));
  std::vector<float> dx(x.size(), 0.f);
  auto dw = random_vec(w.size(), seed + 3);
  std::vector<float> want(dw.size());
  for (std::int64_t j = 0; j < c; ++j) {
    double acc = 0.0;
    for (std::int64_t i = 0; i < n; ++i) {
      const std::size_t e = static_cast<std::size_t>(i * c + j);
      acc += static_cast<double>(g[e] * (x[e] * rstd[static_cast<std::size_t>(i)]));
    }
    want[static_cast<std::size_t>(j)] = dw[static_cast<std::size_t>(j)] + static_cast<float>(acc);
  }
  rmsnorm_backward(kokkos_ctx(), view(g, {n, c}), view(x, {n, c}), view(w, {c}), view(rstd, {n}),
                   view(dx, {n, c}), view(dw, {c}));
  expect_bitwise(dw, want, "dw");
}

TEST(RmsNorm, BackwardWeightGradientSumsRowsInOrder) {
  check_rmsnorm_dw_bits(37, 70, 40);
  check_rmsnorm_dw_bits(5, 4096, 41);  // the widest one-pass row on the host
  check_rmsnorm_dw_bits(3, 4100, 42);  // two passes
}

}  // namespace
}  // namespace dst::kernels::test
