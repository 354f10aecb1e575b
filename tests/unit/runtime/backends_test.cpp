// kernels.backend and parallel.backend against the build and the rank's device
// (runtime::resolve_backends): auto picks the GPU path only where the model runs on a
// GPU, and a choice the build or the device cannot honour is a deck error naming the key.
#include <gtest/gtest.h>

#include <string>

#include "config/run_config.hpp"
#include "core/error.hpp"
#include "core/version.hpp"
#include "runtime/runtime.hpp"

namespace dst::runtime {
namespace {

DeviceInfo host() {
  return DeviceInfo{};
}

DeviceInfo gpu() {
  DeviceInfo d;
  d.kind = "cuda";
  d.index = 0;
  d.name = "a GPU";
  return d;
}

config::RunConfig deck(const std::string& kernels, const std::string& comm) {
  config::RunConfig c;
  c.kernels.backend = parse_enum<config::KernelsBackend>(kernels).value();
  c.parallel.backend = parse_enum<config::ParallelBackend>(comm).value();
  return c;
}

/// The DeckError's key, or "" if `f` does not throw one.
template <class F>
std::string deck_error_key(F f, std::string* message = nullptr) {
  try {
    f();
  } catch (const DeckError& e) {
    if (message) *message = e.what();
    return e.key();
  }
  return "";
}

TEST(Backends, AutoOnTheHostIsKokkosAndSharedMemoryOnOneNode) {
  const Backends b = resolve_backends(deck("auto", "auto"), host(), 2, 1);
  EXPECT_EQ(to_string(b.kernels), "kokkos");
  EXPECT_EQ(to_string(b.comm), "shm");
  // Alone there is nothing to sum; across nodes there is no shared memory.
  EXPECT_EQ(to_string(resolve_backends(deck("auto", "auto"), host(), 1, 1).comm), "mpi");
  EXPECT_EQ(to_string(resolve_backends(deck("auto", "auto"), host(), 4, 2).comm), "mpi");
  EXPECT_EQ(to_string(resolve_backends(deck("auto", "mpi"), host(), 2, 1).comm), "mpi");
  EXPECT_EQ(to_string(resolve_backends(deck("auto", "shm"), host(), 1, 1).comm), "shm");
}

TEST(Backends, ExpertParallelismTakesMpiWithOrWithoutPipelineStages) {
  // Each rank holds its own routed experts, summed over the ranks holding the same ones:
  // one flat shared-memory sum over the data group cannot do that. Pipeline stages store
  // their own experts too (model::own_expert_storage), so auto takes MPI there as well.
  for (const std::int64_t stages : {1, 2}) {
    config::RunConfig c = deck("auto", "auto");
    c.model.n_routed_experts = 4;
    c.parallel.expert = 2;
    c.parallel.pipeline = stages;
    EXPECT_EQ(to_string(resolve_backends(c, host(), 2, 1).comm), "mpi") << stages << " stages";
    c.parallel.backend = config::ParallelBackend::shm;
    std::string msg;
    EXPECT_EQ(deck_error_key([&] { resolve_backends(c, host(), 2, 1); }, &msg), "parallel.backend")
        << stages << " stages";
    EXPECT_NE(msg.find("own routed experts"), std::string::npos) << msg;
  }
  // A dense model has no experts to split: shared memory as before.
  config::RunConfig dense = deck("auto", "auto");
  dense.parallel.expert = 2;
  EXPECT_EQ(to_string(resolve_backends(dense, host(), 2, 1).comm), "shm");
}

TEST(Backends, SharedMemoryNeedsHostKernelsAndOneNode) {
  std::string msg;
  EXPECT_EQ(deck_error_key([] { resolve_backends(deck("auto", "shm"), host(), 4, 2); }, &msg),
            "parallel.backend");
  EXPECT_NE(msg.find("spans 2 nodes"), std::string::npos) << msg;
  EXPECT_EQ(deck_error_key([] { resolve_backends(deck("auto", "shm"), gpu(), 2, 1); }, &msg),
            "parallel.backend");
  EXPECT_NE(msg.find("host memory"), std::string::npos) << msg;
}

TEST(Backends, AutoOnAGpuIsCudaAndNcclWhereBuilt) {
  const Backends b = resolve_backends(deck("auto", "auto"), gpu(), 2);
  EXPECT_EQ(to_string(b.kernels), "cuda");
  EXPECT_EQ(to_string(b.comm), core::built_with_nccl() ? "nccl" : "mpi");
}

TEST(Backends, AutoAloneOnAGpuKeepsMpi) {
  // One rank in the data group: nothing to sum, so no NCCL communicator to set up; an
  // explicit 'nccl' is still honoured.
  const Backends b = resolve_backends(deck("auto", "auto"), gpu(), 1);
  EXPECT_EQ(to_string(b.kernels), "cuda");
  EXPECT_EQ(to_string(b.comm), "mpi");
  if (core::built_with_nccl()) {
    EXPECT_EQ(to_string(resolve_backends(deck("auto", "nccl"), gpu(), 1).comm), "nccl");
  }
}

TEST(Backends, KokkosOnAGpuKeepsTheGradientsOnTheHost) {
  // The CPU half of the GPU parity check: host kernels on a GPU machine sum host memory.
  const Backends b = resolve_backends(deck("kokkos", "auto"), gpu(), 2);
  EXPECT_EQ(to_string(b.kernels), "kokkos");
  EXPECT_EQ(to_string(b.comm), "shm");
  EXPECT_EQ(to_string(resolve_backends(deck("kokkos", "auto"), gpu(), 2, 3).comm), "mpi");
}

TEST(Backends, CudaWithoutADeviceIsADeckError) {
  std::string msg;
  EXPECT_EQ(deck_error_key([] { resolve_backends(deck("cuda", "auto"), host(), 2); }, &msg),
            "kernels.backend");
  EXPECT_NE(msg.find(core::built_with_cuda() ? "no CUDA device" : "DSTRAIN_ENABLE_CUDA=ON"),
            std::string::npos)
      << msg;
}

TEST(Backends, CudaOnACudaBuildWithoutAGpuSaysWhy) {
  // select_device's answer on a login node: the CUDA runtime's reason reaches the message.
  DeviceInfo bare = host();
  bare.no_gpu_reason = "no CUDA-capable device is detected";
  std::string msg;
  EXPECT_EQ(deck_error_key([&] { resolve_backends(deck("cuda", "auto"), bare, 1); }, &msg),
            "kernels.backend");
  if (core::built_with_cuda()) {
    EXPECT_NE(msg.find("no CUDA-capable device is detected"), std::string::npos) << msg;
  }
  EXPECT_EQ(to_string(resolve_backends(deck("auto", "auto"), bare, 1).kernels), "kokkos");
}

TEST(Backends, NcclNeedsAnNcclBuildAndTheModelOnTheGpu) {
  std::string msg;
  EXPECT_EQ(deck_error_key([] { resolve_backends(deck("kokkos", "nccl"), host(), 2); }, &msg),
            "parallel.backend");
  EXPECT_NE(msg.find(core::built_with_nccl() ? "GPU memory" : "DSTRAIN_ENABLE_NCCL=ON"),
            std::string::npos)
      << msg;
  if (core::built_with_nccl()) {
    EXPECT_EQ(to_string(resolve_backends(deck("cuda", "nccl"), gpu(), 2).comm), "nccl");
  } else {
    EXPECT_EQ(deck_error_key([] { resolve_backends(deck("cuda", "nccl"), gpu(), 2); }),
              "parallel.backend");
  }
  EXPECT_EQ(to_string(resolve_backends(deck("auto", "mpi"), gpu(), 2).comm), "mpi");
}

}  // namespace
}  // namespace dst::runtime
