// add / accumulate / zero, and the interface's checks: shapes, dtypes, devices, back end.
#include <cstdint>

#include "core/version.hpp"
#include "kernels_test_util.hpp"

namespace dst::kernels::test {
namespace {

TEST(Elementwise, AddAccumulateAndAliases) {
  const std::int64_t n = 3, c = 7;
  const auto a = random_vec(static_cast<std::size_t>(n * c), 80);
  const auto b = random_vec(a.size(), 81);
  std::vector<double> sum(a.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    sum[i] = static_cast<double>(a[i]) + b[i];
  auto x = a, y = b;
  std::vector<float> out(a.size());
  add(kokkos_ctx(), view(x, {n, c}), view(y, {n, c}), view(out, {n, c}));
  // One float addition: correctly rounded, half an ulp of values < 2.
  expect_close(out, sum, 1.2e-7, 0, "out");
  add(kokkos_ctx(), view(x, {n, c}), view(y, {n, c}), view(x, {n, c}));  // out aliases a
  expect_bitwise(x, out, "out aliasing a");
  x = a;
  add(kokkos_ctx(), view(x, {n, c}), view(y, {n, c}), view(y, {n, c}));  // out aliases b
  expect_bitwise(y, out, "out aliasing b");

  y = b;
  x = a;
  accumulate(kokkos_ctx(), view(x, {n, c}), view(y, {n, c}));
  expect_bitwise(y, out, "accumulate");
}

TEST(Elementwise, ZeroEveryWidth) {
  std::vector<float> f = random_vec(13, 82);
  zero(kokkos_ctx(), view(f, {13}));
  expect_bitwise(f, std::vector<float>(13, 0.0f), "f32");
  std::vector<std::int32_t> i(5, 7);
  zero(kokkos_ctx(), view(i, {5}));
  EXPECT_EQ(i, std::vector<std::int32_t>(5, 0));
  std::vector<double> d(3, 1.5);
  zero(kokkos_ctx(), view(d, {3}));
  EXPECT_EQ(d, std::vector<double>(3, 0.0));
  std::vector<std::uint16_t> h(9, 0x3f80);  // bf16 bits of 1.0
  zero(kokkos_ctx(), Tensor{h.data(), Shape{9}, DType::bf16, Device::host});
  EXPECT_EQ(h, std::vector<std::uint16_t>(9, 0));
  std::vector<std::uint8_t> u(7, 1);
  zero(kokkos_ctx(), view(u, {7}));
  EXPECT_EQ(u, std::vector<std::uint8_t>(7, 0));
}

TEST(Elementwise, EmptyTensorsAreNoOps) {
  std::vector<float> e;
  EXPECT_NO_THROW(add(kokkos_ctx(), Tensor{nullptr, Shape{0, 4}}, Tensor{nullptr, Shape{0, 4}},
                      Tensor{nullptr, Shape{0, 4}}));
  EXPECT_NO_THROW(zero(kokkos_ctx(), Tensor{nullptr, Shape{0}}));
}

// --- checks ------------------------------------------------------------------------------

TEST(KernelChecks, WrongShapesNameTheKernelAndTensor) {
  const auto ctx = kokkos_ctx();
  std::vector<float> a(24), b(24), c(24), d(24), e(24);
  std::vector<std::int32_t> tok(4, 0);
  expect_error(
      [&] {
        rmsnorm_forward(ctx, view(a, {4, 6}), view(b, {6}).reshaped({6}), 1e-5f, view(c, {4, 6}),
                        Tensor{d.data(), Shape{6}});
      },
      {"kernels::rmsnorm_forward", "rstd", "(4)", "(6)"});
  expect_error(
      [&] {
        rmsnorm_backward(ctx, view(a, {4, 6}), view(b, {4, 6}), Tensor{c.data(), Shape{5}},
                         Tensor{d.data(), Shape{4}}, view(e, {4, 6}), Tensor{c.data(), Shape{6}});
      },
      {"kernels::rmsnorm_backward", "w", "(6)", "(5)"});
  expect_error(
      [&] {
        embedding_forward(ctx, view(tok, {4}), view(a, {4, 6}), Tensor{b.data(), Shape{4, 5}});
      },
      {"kernels::embedding_forward", "out", "(4, 6)", "(4, 5)"});
  expect_error(
      [&] {
        swiglu_forward(ctx, view(a, {4, 6}), view(b, {4, 6}), view(c, {6, 4}));
      },
      {"kernels::swiglu_forward", "out"});
  expect_error(
      [&] {
        causal_softmax_forward(ctx, view(a, {1, 1, 4, 6}), 1.0f, view(b, {1, 1, 4, 6}));
      },
      {"kernels::causal_softmax_forward", "scores", "(1, 1, 4, 6)"});
  expect_error(
      [&] {
        rope_forward(ctx, view(a, {1, 2, 2, 6}), Tensor{b.data(), Shape{2, 2}},
                     Tensor{c.data(), Shape{2, 2}});
      },
      {"kernels::rope_forward", "cos", "(>= 2, 3)"});
  expect_error(
      [&] {
        rope_backward(ctx, Tensor{a.data(), Shape{1, 2, 3, 4}, DType::f32},
                      Tensor{b.data(), Shape{1, 2}}, Tensor{c.data(), Shape{1, 2}});
      },
      {"kernels::rope_backward", "cos", "(>= 2, 2)"});
  expect_error(
      [&] {
        cross_entropy_forward(ctx, view(a, {4, 6}), Tensor{tok.data(), Shape{3}, DType::i32}, -1,
                              Tensor{b.data(), Shape{4}});
      },
      {"kernels::cross_entropy_forward", "targets", "(4)", "(3)"});
  expect_error(
      [&] {
        accumulate(ctx, view(a, {4, 6}), view(b, {24}));
      },
      {"kernels::accumulate", "y"});
}

TEST(KernelChecks, WrongDtypeAndDeviceAndBadScalars) {
  const auto ctx = kokkos_ctx();
  std::vector<float> a(8), b(8), c(8);
  std::vector<double> dd(8);
  expect_error([&] { add(ctx, view(a, {8}), view(dd, {8}), view(c, {8})); },
               {"kernels::add", "b", "f32", "f64"});
  std::vector<float> tok_f(2);
  std::vector<float> wte(8);
  expect_error(
      [&] {
        embedding_forward(ctx, view(tok_f, {2}), view(wte, {2, 4}), view(a, {2, 4}));
      },
      {"kernels::embedding_forward", "tokens", "i32"});
  Tensor on_gpu = view(b, {8});
  on_gpu.device = Device::cuda;
  expect_error([&] { accumulate(ctx, view(a, {8}), on_gpu); },
               {"kernels::accumulate", "y", "cuda", "host"});
  expect_error(
      [&] {
        add(ctx, view(a, {8}), Tensor{nullptr, Shape{8}}, view(c, {8}));
      },
      {"kernels::add", "b", "without data"});
  expect_error(
      [&] {
        rmsnorm_forward(ctx, view(a, {2, 4}), Tensor{b.data(), Shape{4}}, -1.0f, view(c, {2, 4}),
                        view(dd, {2}));
      },
      {"kernels::rmsnorm_forward", "rstd"});  // rstd f64
  std::vector<float> r(2);
  expect_error(
      [&] {
        rmsnorm_forward(ctx, view(a, {2, 4}), Tensor{b.data(), Shape{4}}, -1.0f, view(c, {2, 4}),
                        view(r, {2}));
      },
      {"kernels::rmsnorm_forward", "eps"});
  expect_error(
      [&] {
        rope_tables(ctx, 0.0, view(a, {2, 4}), view(b, {2, 4}));
      },
      {"kernels::rope_tables", "theta"});
  expect_error(
      [&] {
        rope_forward(ctx, view(a, {1, 1, 1, 8}).reshaped({1, 2, 1, 4}).reshaped({1, 1, 8, 1}),
                     view(b, {1, 4}), view(c, {1, 4}));
      },
      {"kernels::rope_forward", "odd"});
}

TEST(KernelChecks, CudaBackendIsNotBuiltHere) {
  if (core::built_with_cuda()) GTEST_SKIP() << "this build has the CUDA back end";
  std::vector<float> a(4), b(4), c(4);
  const ExecContext cuda{tensor::Backend::cuda, nullptr};
  expect_error([&] { add(cuda, view(a, {4}), view(b, {4}), view(c, {4})); },
               {"kernels: the CUDA back end is not built (DSTRAIN_ENABLE_CUDA=OFF)"});
  expect_error([&] { zero(cuda, view(a, {4})); }, {"CUDA back end is not built"});
}

}  // namespace
}  // namespace dst::kernels::test
