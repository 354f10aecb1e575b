// The fused attention interface (kernels.hpp; cuDNN SDPA on the CUDA back end) where it does not
// exist: on the Kokkos back end it is never supported, asking never throws, and calling it
// anyway throws a dst::Error that says to use the unfused path. Needs no Kokkos: the fused entry
// points reject a Kokkos context before anything else.
#include "kernels_test_util.hpp"

namespace dst::kernels::test {
namespace {

using Index = std::int64_t;

ExecContext with_math(tensor::Backend backend, DType math) {
  ExecContext ctx;
  ctx.backend = backend;
  ctx.math = math;
  return ctx;
}

TEST(FusedAttention, NotSupportedOnTheKokkosBackEnd) {
  EXPECT_FALSE(fused_attention_supported(ExecContext{}, 2, 64, 4, 4, 64));
  for (const DType math : {DType::f32, DType::bf16, DType::f16}) {
    EXPECT_FALSE(
        fused_attention_supported(with_math(tensor::Backend::kokkos, math), 2, 64, 4, 4, 64))
        << dtype_name(math);
    EXPECT_FALSE(
        fused_attention_supported(with_math(tensor::Backend::kokkos, math), 1, 1, 8, 2, 128))
        << dtype_name(math);
  }
}

TEST(FusedAttention, AskingNeverThrows) {
  // Invalid shapes, f32 math, and (in builds without CUDA or without a device) the CUDA back
  // end itself: all answer false.
  for (const tensor::Backend backend : {tensor::Backend::kokkos, tensor::Backend::cuda}) {
    EXPECT_NO_THROW(
        EXPECT_FALSE(fused_attention_supported(with_math(backend, DType::f32), 2, 64, 4, 4, 64)));
    EXPECT_NO_THROW(
        EXPECT_FALSE(fused_attention_supported(with_math(backend, DType::bf16), 2, 64, 6, 4, 64)));
    EXPECT_NO_THROW(
        EXPECT_FALSE(fused_attention_supported(with_math(backend, DType::bf16), -1, 64, 4, 4, 64)));
    EXPECT_NO_THROW(
        EXPECT_FALSE(fused_attention_supported(with_math(backend, DType::bf16), 2, 64, 4, 0, 64)));
  }
}

TEST(FusedAttention, ForwardAndBackwardOnTheKokkosBackEndThrowClearly) {
  const Index b = 1, t = 4, h = 2, kv = 1, d = 8;
  std::vector<float> q(static_cast<std::size_t>(b * t * h * d));
  std::vector<float> k(static_cast<std::size_t>(b * t * kv * d));
  std::vector<float> v = k, out = q, dout = q, dq = q, dk = k, dv = k;
  std::vector<float> stats(static_cast<std::size_t>(b * h * t));
  const Shape qs{b, t, h, d}, ks{b, t, kv, d}, ss{b, h, t};
  for (const DType math : {DType::f32, DType::bf16}) {
    const ExecContext ctx = with_math(tensor::Backend::kokkos, math);
    expect_error(
        [&] {
          fused_attention_forward(ctx, view(q, qs), view(k, ks), view(v, ks), 0.35f, view(out, qs),
                                  view(stats, ss));
        },
        {"kernels::fused_attention_forward", "only on the CUDA back end", "kokkos",
         "unfused path"});
    expect_error(
        [&] {
          fused_attention_backward(ctx, view(q, qs), view(k, ks), view(v, ks), view(out, qs),
                                   view(dout, qs), view(stats, ss), 0.35f, view(dq, qs),
                                   view(dk, ks), view(dv, ks));
        },
        {"kernels::fused_attention_backward", "only on the CUDA back end", "kokkos"});
  }
  // Nothing was written.
  for (const float x : out)
    EXPECT_EQ(x, 0.0f);
  for (const float x : dq)
    EXPECT_EQ(x, 0.0f);
}

}  // namespace
}  // namespace dst::kernels::test
