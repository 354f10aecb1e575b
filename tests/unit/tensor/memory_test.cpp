// The allocator and copies of tensor/memory.hpp on the host, the Arena built on them, and
// what a CPU build says when asked for device memory. (The CUDA side of the same calls
// is exercised by every GPU test and run: tests/gpu, benchmarks/gpu/parity.)
#include "tensor/memory.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "config/deck.hpp"
#include "core/error.hpp"
#include "model/param_store.hpp"
#include "tensor/arena.hpp"

namespace dst::tensor {
namespace {

TEST(Memory, HostAllocationsAreZeroedAndAligned) {
  for (const std::size_t bytes : {1u, 63u, 64u, 1000u, 1u << 20}) {
    auto* p = static_cast<unsigned char*>(allocate(Device::host, bytes, nullptr, "test"));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 64, 0u) << bytes;
    for (std::size_t i = 0; i < bytes; ++i)
      ASSERT_EQ(p[i], 0) << "byte " << i << " of " << bytes;
    release(Device::host, p, nullptr);
  }
  EXPECT_EQ(allocate(Device::host, 0, nullptr, "nothing"), nullptr);
  release(Device::host, nullptr, nullptr);  // a no-op
}

TEST(Memory, HostCopiesFillsAndTensorTransfers) {
  const ExecContext host;
  EXPECT_EQ(device_of(host), Device::host);
  EXPECT_EQ(device_of(ExecContext{Backend::cuda, nullptr}), Device::cuda);
  std::vector<float> a(100), b(100, -1.0f);
  std::iota(a.begin(), a.end(), 1.0f);
  copy(host, b.data(), a.data(), a.size() * sizeof(float));
  EXPECT_EQ(a, b);
  // Overlapping ranges behave as memmove.
  copy(host, b.data() + 1, b.data(), 50 * sizeof(float));
  EXPECT_EQ(b[1], 1.0f);
  EXPECT_EQ(b[50], 50.0f);
  fill_zero(host, b.data() + 10, 5 * sizeof(float));
  for (int i = 10; i < 15; ++i)
    EXPECT_EQ(b[static_cast<std::size_t>(i)], 0.0f);
  EXPECT_EQ(b[15], a[14]);

  Tensor t{a.data(), {10, 10}};
  std::vector<float> down(100);
  download(host, t, down.data());
  EXPECT_EQ(down, a);
  down.assign(100, 7.0f);
  upload(host, down.data(), t);
  EXPECT_EQ(a, down);
  synchronize(host);  // nothing to wait for
  EXPECT_EQ(peak_device_bytes(Device::host), 0u);
}

#if !DSTRAIN_TEST_CUDA_BUILD
TEST(Memory, DeviceMemoryInAHostBuildIsAClearError) {
  try {
    (void)allocate(Device::cuda, 16, nullptr, "arena 'activations'");
    FAIL() << "allocate(cuda) succeeded in a build without CUDA";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("arena 'activations'"), std::string::npos) << what;
    EXPECT_NE(what.find("DSTRAIN_ENABLE_CUDA=OFF"), std::string::npos) << what;
  }
  EXPECT_THROW(Arena("activations", Arena::Mode::allocate, 64, Device::cuda), Error);
  // Planning allocates nothing, on any device: `dstrain check` of a GPU layout works.
  Arena plan("activations", Arena::Mode::plan, 0, Device::cuda);
  const Tensor t = plan.take("x", {4, 4}, DType::f32);
  EXPECT_EQ(t.device, Device::cuda);
  EXPECT_EQ(t.data, nullptr);
}
#endif

TEST(Memory, ArenaTensorsCarryTheArenasDevice) {
  Arena a("a", Arena::Mode::allocate, 1024);
  EXPECT_EQ(a.device(), Device::host);
  const Tensor t = a.take("x", {8, 8}, DType::f32);
  EXPECT_EQ(t.device, Device::host);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.data) % Arena::kAlignment, 0u);
  for (int i = 0; i < 64; ++i)
    EXPECT_EQ(t.ptr<float>()[i], 0.0f);
  Arena moved = std::move(a);
  EXPECT_EQ(moved.base(), t.data);
  EXPECT_EQ(a.base(), nullptr);  // NOLINT(bugprone-use-after-move): the moved-from state
}

// A one-layer model small enough for a few kilobytes of parameters.
config::ModelSection small_model() {
  config::ModelSection m;
  m.vocab_size = 32;
  m.d_model = 16;
  m.n_layers = 1;
  m.n_heads = 2;
  m.n_kv_heads = 2;
  m.ffn_dim = 32;
  m.max_seq_len = 8;
  return m;
}

TEST(Memory, ParamStoreTensorsAndFlatViewsShareTheBuffers) {
  const config::ModelSection m = small_model();
  model::ParamStore ps(model::dense_parameter_layout(m), Arena::Mode::allocate);
  EXPECT_EQ(device_of(ps.context()), Device::host);
  ps.initialize(7);
  const Tensor flat = ps.params_flat();
  EXPECT_EQ(flat.data, ps.params_data());
  EXPECT_EQ(flat.numel(), static_cast<std::int64_t>(ps.buffer_elements()));
  EXPECT_EQ(ps.param(1).data, ps.params_data() + ps.spec(1).offset);
  EXPECT_EQ(ps.param(1).device, Device::host);
  // zero_grads goes through fill_zero.
  ps.grads_data()[3] = 5.0f;
  ps.zero_grads();
  EXPECT_EQ(ps.grads_flat().ptr<float>()[3], 0.0f);
}

// The gradients of parallel.backend shm live in memory the store does not own: the
// arena carves it without freeing it, refuses misaligned memory, and the store's gradient
// views point into it while its parameters keep their own allocation.
TEST(Memory, ParamStoreGradientsInMemoryGivenFromOutside) {
  const auto specs = model::dense_parameter_layout(small_model());
  const std::size_t n = model::flat_buffer_elements(specs);
  alignas(64) static float outside[4096];
  ASSERT_LE(n, 4096u);
  {
    model::ParamStore ps(specs, Arena::Mode::allocate, {}, outside);
    EXPECT_EQ(ps.buffer_elements(), n);
    EXPECT_EQ(ps.grads_data(), outside);
    EXPECT_EQ(ps.grad(2).data, outside + ps.spec(2).offset);
    EXPECT_NE(ps.params_data(), outside);
    outside[5] = 3.0f;
    ps.zero_grads();
    EXPECT_EQ(outside[5], 0.0f);
  }
  outside[0] = 1.0f;  // still ours after the store is gone (never freed by it)
  EXPECT_THROW(Arena("x", outside + 1, 64), Error);
  EXPECT_THROW(model::ParamStore(specs, Arena::Mode::plan, {}, outside), Error);
}

}  // namespace
}  // namespace dst::tensor
