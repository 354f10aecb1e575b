// GradNorm, first_nonfinite_grad and clip_factor over a ParamStore's gradients.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "core/error.hpp"
#include "fp_trap.hpp"
#include "model/param_store.hpp"
#include "train/grad_norm.hpp"

namespace dst::train {
namespace {

using model::ParamSpec;
using model::ParamStore;

tensor::ExecContext ctx() {
  return tensor::ExecContext{tensor::Backend::kokkos, nullptr};
}

std::vector<ParamSpec> specs() {
  return {ParamSpec{"a", {4, 3}, model::Init::normal, 0.02f, true, 0},
          ParamSpec{"b", {5}, model::Init::ones, 0.0f, false, 0},
          ParamSpec{"c", {100, 100}, model::Init::normal, 0.02f, true, 0}};
}

TEST(GradNorm, PerTensorAndTotalExactOnIntegers) {
  ParamStore store(specs(), tensor::Arena::Mode::allocate);
  std::vector<double> expected(store.size(), 0.0);
  for (std::size_t i = 0; i < store.size(); ++i) {
    float* g = store.grad(i).ptr<float>();
    for (std::int64_t j = 0; j < store.spec(i).shape.numel(); ++j) {
      const auto k = static_cast<int>((j * 7 + static_cast<std::int64_t>(i)) % 23) - 11;
      g[j] = static_cast<float>(k);
      expected[i] += k * k;
    }
  }
  // Padding between tensors holds garbage a wrong range would pick up.
  store.grads_data()[12] = 1000.0f;  // after "a" (12 elements), before "b" at offset 16
  GradNorm norm;
  const double total = norm.compute(ctx(), store);
  ASSERT_EQ(norm.per_tensor().size(), store.size());
  for (std::size_t i = 0; i < store.size(); ++i)
    EXPECT_EQ(norm.per_tensor()[i], expected[i]) << store.spec(i).name;  // integers: exact
  EXPECT_EQ(total, expected[0] + expected[1] + expected[2]);
  EXPECT_EQ(norm.local_sum_of_squares(), total);
  // Recomputing reuses the storage and gives the same bits.
  const double* storage = norm.per_tensor().data();
  EXPECT_EQ(norm.compute(ctx(), store), total);
  EXPECT_EQ(norm.per_tensor().data(), storage);
}

TEST(GradNorm, FirstNonfiniteGradientNamesTensorAndElement) {
  ParamStore store(specs(), tensor::Arena::Mode::allocate);
  EXPECT_FALSE(first_nonfinite_grad(ctx(), store).found());
  dst::test::FpTrapDisabled trap_off;                                // NaN and Inf on purpose
  store.grads_data()[13] = std::numeric_limits<float>::quiet_NaN();  // padding: not a grad
  EXPECT_FALSE(first_nonfinite_grad(ctx(), store).found());
  store.grad(2).ptr<float>()[4321] = std::numeric_limits<float>::infinity();
  auto at = first_nonfinite_grad(ctx(), store);
  EXPECT_EQ(at.tensor, 2);
  EXPECT_EQ(at.element, 4321);
  store.grad(1).ptr<float>()[3] = std::numeric_limits<float>::quiet_NaN();
  at = first_nonfinite_grad(ctx(), store);
  EXPECT_EQ(at.tensor, 1);
  EXPECT_EQ(at.element, 3);
}

TEST(GradNorm, ClipFactorLikeTorchClipGradNorm) {
  EXPECT_EQ(clip_factor(0.5, 1.0), 1.0);  // below the threshold: untouched
  EXPECT_EQ(clip_factor(0.0, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(clip_factor(4.0, 1.0), 1.0 / (4.0 + 1e-6));
  EXPECT_EQ(clip_factor(1e9, 0.0), 1.0);  // grad_clip 0: no clipping
  EXPECT_THROW(clip_factor(std::numeric_limits<double>::quiet_NaN(), 1.0), Error);
  EXPECT_THROW(clip_factor(1.0, -1.0), Error);
  EXPECT_THROW(clip_factor(std::numeric_limits<double>::infinity(), 1.0), Error);
}

}  // namespace
}  // namespace dst::train
