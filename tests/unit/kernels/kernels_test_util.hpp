#pragma once
// Shared helpers of the kernel tests: host tensors over std::vector, fixed-seed random
// data, an absolute + relative comparison, central finite differences in double, and the
// floating-point trap guard for tests that feed non-finite values on purpose.
#include <gtest/gtest.h>
#include "fp_trap.hpp"

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernels.hpp"

namespace dst::kernels::test {

using tensor::Device;
using tensor::ExecContext;
using tensor::Shape;
using tensor::Tensor;

inline ExecContext kokkos_ctx() {
  return ExecContext{tensor::Backend::kokkos, nullptr};
}

template <class T>
Tensor view(std::vector<T>& v, Shape s) {
  // At least as large (error tests view one buffer under several wrong shapes).
  EXPECT_GE(static_cast<std::int64_t>(v.size()), s.numel()) << "test bug: buffer too small";
  return Tensor{v.data(), s, dtype_of<T>::value, Device::host};
}

/// Uniform values in [lo, hi) from a fixed seed (reproducible failures).
inline std::vector<float> random_vec(std::size_t n, std::uint32_t seed, float lo = -1.0f,
                                     float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v)
    x = dist(gen);
  return v;
}

inline std::vector<double> to_double(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

/// |actual - expected| <= atol + rtol * |expected| for every element; reports the first
/// few offenders with their index.
inline void expect_close(const std::vector<float>& actual, const std::vector<double>& expected,
                         double atol, double rtol, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  int reported = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double a = actual[i];
    const double e = expected[i];
    const double err = std::fabs(a - e);
    if (!(err <= atol + rtol * std::fabs(e))) {
      ADD_FAILURE() << what << "[" << i << "]: got " << a << ", expected " << e << " (error " << err
                    << " > " << atol + rtol * std::fabs(e) << ")";
      if (++reported == 5) return;
    }
  }
}

/// Bitwise equality (determinism claims and pure data movement only).
inline void expect_bitwise(const std::vector<float>& a, const std::vector<float>& b,
                           const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
      << what << ": not bitwise equal";
}

/// Gradient of the scalar loss(x) by central differences in double. With h = 1e-5 and
/// smooth double references the truncation error is O(h^2 * f''') ~ 1e-10 and the rounding
/// error O(eps_double / h) ~ 1e-11: far below the fp32 kernels' errors, so the FD is the
/// exact gradient as far as the comparisons can tell.
inline std::vector<double> fd_gradient(
    std::vector<double> x, const std::function<double(const std::vector<double>&)>& loss,
    double h = 1e-5) {
  std::vector<double> g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double lp = loss(x);
    x[i] = x0 - h;
    const double lm = loss(x);
    x[i] = x0;
    g[i] = (lp - lm) / (2 * h);
  }
  return g;
}

/// sum_i out[i] * r[i]: the scalar whose gradient with respect to `out` is r, so a
/// backward fed dout = r must return d(loss)/d(input).
inline double weighted_sum(const std::vector<double>& out, const std::vector<float>& r) {
  double s = 0;
  for (std::size_t i = 0; i < out.size(); ++i)
    s += out[i] * r[i];
  return s;
}

using FpTrapOff = dst::test::FpTrapDisabled;

/// Runs `f`, expecting a dst::Error whose message contains every one of `parts`.
template <class F>
void expect_error(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected dst::Error containing '" << parts.front() << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg;
  }
}

}  // namespace dst::kernels::test
