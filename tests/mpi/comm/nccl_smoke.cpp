// comm_nccl_smoke: the NCCL communicator on real GPUs (built only with
// DSTRAIN_ENABLE_NCCL=ON; docs/nccl.md). One rank per GPU:
//   mpiexec -n <ranks> build/cuda-release/tests/mpi/comm/comm_nccl_smoke
// Every rank binds GPU (node-local rank mod devices), makes the NCCL communicator of the
// world through the MPI bootstrap, and checks every collective of the Communicator
// interface against values computed on the host (ZeRO's reduce-scatter and all-gather of
// unequal blocks, expert parallelism's all-to-alls included), then times one 64 MiB
// allreduce.
// Exit codes: 0 all checks passed ("NCCL SMOKE OK" from rank 0), 1 a check or call
// failed (the message names it), 77 no CUDA device here (CTest reports a skip).
#include <cuda_runtime.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "comm/mpi_communicator.hpp"
#include "comm/nccl_communicator.hpp"
#include "core/error.hpp"
#include "core/log.hpp"

namespace {

using dst::DType;
using dst::comm::ReduceOp;

void cuda_check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess)
    throw dst::Error(std::string(what) + ": " + cudaGetErrorName(rc) + " (" +
                     cudaGetErrorString(rc) + ")");
}

/// A device buffer of n floats.
struct DeviceFloats {
  explicit DeviceFloats(std::size_t n) : size(n) {
    cuda_check(cudaMalloc(&ptr, n * sizeof(float)), "cudaMalloc");
  }
  ~DeviceFloats() { cudaFree(ptr); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  void upload(const std::vector<float>& h) {
    cuda_check(cudaMemcpy(ptr, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice),
               "cudaMemcpy to device");
  }
  std::vector<float> download(std::size_t n) const {
    std::vector<float> h(n);
    cuda_check(cudaMemcpy(h.data(), ptr, n * sizeof(float), cudaMemcpyDeviceToHost),
               "cudaMemcpy to host");
    return h;
  }
  float* ptr = nullptr;
  std::size_t size;
};

void expect(bool ok, const std::string& what) {
  if (!ok) throw dst::Error("check failed: " + what);
}

/// Input element i of `rank`: small integers, exact in f32 sums.
float input(int rank, std::size_t i) {
  return static_cast<float>((rank * 7 + i * 3) % 11);
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0;
  int n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  dst::log::set_rank(rank);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    if (rank == 0) std::fprintf(stderr, "comm_nccl_smoke: no CUDA device here; skipping\n");
    MPI_Finalize();
    return 77;
  }
  try {
    MPI_Comm node = MPI_COMM_NULL;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    int local = 0;
    MPI_Comm_rank(node, &local);
    MPI_Comm_free(&node);
    cuda_check(cudaSetDevice(local % devices), "cudaSetDevice");

    auto world_mpi = dst::comm::make_mpi_communicator(MPI_COMM_WORLD, "world", 60.0);
    auto comm = dst::comm::make_nccl_communicator(*world_mpi, "world", 60.0, 120.0);

    const std::size_t count = 1000;
    // allreduce(sum), two in flight at once.
    {
      DeviceFloats a(count), b(count);
      std::vector<float> h(count);
      for (std::size_t i = 0; i < count; ++i)
        h[i] = input(rank, i);
      a.upload(h);
      b.upload(h);
      auto ra = comm->iallreduce(a.ptr, count, DType::f32, ReduceOp::sum);
      auto rb = comm->iallreduce(b.ptr, count, DType::f32, ReduceOp::max);
      rb.wait();
      ra.wait();
      const auto sa = a.download(count), sb = b.download(count);
      for (std::size_t i = 0; i < count; ++i) {
        float sum = 0, mx = input(0, i);
        for (int r = 0; r < n; ++r) {
          sum += input(r, i);
          mx = std::max(mx, input(r, i));
        }
        expect(sa[i] == sum, "allreduce(sum) element " + std::to_string(i));
        expect(sb[i] == mx, "allreduce(max) element " + std::to_string(i));
      }
    }
    // reduce_scatter, out of place and in place (result at the start of recv).
    for (const bool in_place : {false, true}) {
      DeviceFloats send(count * n), recv(count * n);
      std::vector<float> h(count * n);
      for (std::size_t i = 0; i < h.size(); ++i)
        h[i] = input(rank, i);
      send.upload(h);
      if (in_place) recv.upload(h);
      comm->reduce_scatter(in_place ? recv.ptr : send.ptr, recv.ptr, count, DType::f32,
                           ReduceOp::sum);
      const auto out = recv.download(count);
      for (std::size_t i = 0; i < count; ++i) {
        float sum = 0;
        for (int r = 0; r < n; ++r)
          sum += input(r, rank * count + i);
        expect(out[i] == sum, std::string("reduce_scatter") + (in_place ? " in place" : "") +
                                  " element " + std::to_string(i));
      }
    }
    // allgather, broadcast from the last rank, barrier.
    {
      DeviceFloats send(count), recv(count * n);
      std::vector<float> h(count, static_cast<float>(rank));
      send.upload(h);
      comm->allgather(send.ptr, recv.ptr, count, DType::f32);
      const auto out = recv.download(count * n);
      for (std::size_t i = 0; i < out.size(); ++i)
        expect(out[i] == static_cast<float>(i / count), "allgather element " + std::to_string(i));
      DeviceFloats buf(count);
      buf.upload(std::vector<float>(count, rank == n - 1 ? 42.0f : -1.0f));
      comm->broadcast(buf.ptr, count, DType::f32, n - 1);
      for (float v : buf.download(count))
        expect(v == 42.0f, "broadcast value");
      comm->barrier();
    }
    // ZeRO's shard collectives: blocks of unequal sizes (rank 1's empty), in place, both
    // in flight at once on separate buffers.
    {
      std::vector<std::size_t> counts(static_cast<std::size_t>(n));
      std::size_t total = 0, at = 0;
      for (int r = 0; r < n; ++r) {
        counts[static_cast<std::size_t>(r)] = r == 1 ? 0 : 100 + 37 * static_cast<std::size_t>(r);
        total += counts[static_cast<std::size_t>(r)];
      }
      for (int r = 0; r < rank; ++r)
        at += counts[static_cast<std::size_t>(r)];
      const std::size_t mine = counts[static_cast<std::size_t>(rank)];
      DeviceFloats reduced(total), gathered(total);
      std::vector<float> h(total);
      for (std::size_t i = 0; i < total; ++i)
        h[i] = input(rank, i);
      reduced.upload(h);
      std::vector<float> g(total, -1.0f);
      for (std::size_t i = at; i < at + mine; ++i)
        g[i] = static_cast<float>(rank) + 0.5f;  // only this rank's block is final
      gathered.upload(g);
      auto rs = comm->ireduce_scatter_blocks(reduced.ptr, counts, DType::f32, ReduceOp::sum);
      auto ag = comm->iallgather_blocks(gathered.ptr, counts, DType::f32);
      ag.wait();
      rs.wait();
      const auto out = reduced.download(total);
      for (std::size_t i = at; i < at + mine; ++i) {
        float sum = 0;
        for (int r = 0; r < n; ++r)
          sum += input(r, i);
        expect(out[i] == sum, "reduce_scatter_blocks element " + std::to_string(i));
      }
      const auto all = gathered.download(total);
      std::size_t i = 0;
      for (int r = 0; r < n; ++r)
        for (std::size_t k = 0; k < counts[static_cast<std::size_t>(r)]; ++k, ++i)
          expect(all[i] == static_cast<float>(r) + 0.5f,
                 "allgather_blocks element " + std::to_string(i));
      bool refused = false;
      try {
        comm->iallgather_blocks(gathered.ptr, std::vector<std::size_t>(counts.size() + 1, 1),
                                DType::f32);
      } catch (const dst::Error&) {
        refused = true;
      }
      expect(refused, "allgather_blocks with a block size too many refused");
    }
    // Expert parallelism's exchanges: an all-to-all of one count per rank, and an
    // all-to-all of unequal blocks (rank r sends r + 2q + 1 elements to rank q, none to
    // rank 1; element k of the block from r to q is 1000 r + 10 q + k).
    {
      DeviceFloats a_send(static_cast<std::size_t>(n)), a_recv(static_cast<std::size_t>(n));
      std::vector<float> h(static_cast<std::size_t>(n));
      for (int q = 0; q < n; ++q)
        h[static_cast<std::size_t>(q)] = static_cast<float>(100 * rank + q);
      a_send.upload(h);
      comm->ialltoall(a_send.ptr, a_recv.ptr, 1, DType::f32).wait();
      const auto got = a_recv.download(static_cast<std::size_t>(n));
      for (int q = 0; q < n; ++q)
        expect(got[static_cast<std::size_t>(q)] == static_cast<float>(100 * q + rank),
               "alltoall element from rank " + std::to_string(q));
      auto block = [](int from, int to) -> std::size_t {
        return to == 1 ? 0 : static_cast<std::size_t>(from + 2 * to + 1);
      };
      std::vector<std::size_t> sc(static_cast<std::size_t>(n)), rc(sc.size());
      std::vector<float> out;
      for (int q = 0; q < n; ++q) {
        sc[static_cast<std::size_t>(q)] = block(rank, q);
        rc[static_cast<std::size_t>(q)] = block(q, rank);
        for (std::size_t k = 0; k < block(rank, q); ++k)
          out.push_back(static_cast<float>(1000 * rank + 10 * q) + static_cast<float>(k));
      }
      std::size_t received = 0;
      for (const std::size_t c : rc)
        received += c;
      DeviceFloats v_send(std::max<std::size_t>(out.size(), 1)),
          v_recv(std::max<std::size_t>(received, 1));
      if (!out.empty()) v_send.upload(out);
      comm->ialltoallv(v_send.ptr, sc, v_recv.ptr, rc, DType::f32).wait();
      const auto in = v_recv.download(received);
      std::size_t i = 0;
      for (int q = 0; q < n; ++q)
        for (std::size_t k = 0; k < rc[static_cast<std::size_t>(q)]; ++k, ++i)
          expect(in[i] == static_cast<float>(1000 * q + 10 * rank) + static_cast<float>(k),
                 "alltoallv element " + std::to_string(i) + " from rank " + std::to_string(q));
    }
    // Bandwidth of one 64 MiB f32 allreduce (after a warm-up), for the cluster log.
    {
      const std::size_t big = std::size_t{16} << 20;
      DeviceFloats buf(big);
      cuda_check(cudaMemset(buf.ptr, 0, big * sizeof(float)), "cudaMemset");
      comm->allreduce(buf.ptr, big, DType::f32, ReduceOp::sum);
      const auto t0 = std::chrono::steady_clock::now();
      comm->allreduce(buf.ptr, big, DType::f32, ReduceOp::sum);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      // Bus bandwidth as nccl-tests defines it for allreduce: 2 (n-1)/n bytes per byte.
      const double bus = n > 1 ? 2.0 * (n - 1) / n * big * sizeof(float) / s / 1e9 : 0.0;
      if (rank == 0)
        std::printf(
            "comm_nccl_smoke: %d ranks, 64 MiB allreduce %.3f ms, bus bandwidth %.1f GB/s\n", n,
            s * 1e3, bus);
    }
    comm.reset();
    if (rank == 0) std::printf("NCCL SMOKE OK\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] error: %s\n", rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return 0;
}
