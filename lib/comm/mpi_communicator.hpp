#pragma once
/// \file mpi_communicator.hpp
/// The MPI back end of Communicator: host buffers, non-blocking MPI collectives, waits
/// that poll MPI_Test against the communicator's deadline (runtime/mpi_wait.hpp).

#include <mpi.h>

#include <memory>
#include <string>

#include "comm/communicator.hpp"
#include "comm/op_info.hpp"  // reduce_op_name

namespace dst::comm {

/// Collectives over a private duplicate of an MPI communicator.
///
/// The duplicate (MPI_Comm_dup) keeps dstrain's collectives apart from any other traffic
/// on the parent communicator and carries MPI_ERRORS_RETURN, so every failure becomes a
/// dst::Error through DST_MPI_CHECK instead of MPI's default abort without context.
///
/// Element types: sum/max/min reductions support f32, f64, i32, i64, u8, u32, u64. MPI has
/// no bf16/f16 arithmetic, so reducing those throws dst::Error (reduce in f32 instead);
/// allgather and broadcast move bf16/f16 as 16-bit words. Counts must fit MPI's int.
///
/// Not thread-safe: one thread issues and waits the collectives of a communicator.
class MpiCommunicator final : public Communicator {
 public:
  /// Duplicates `parent` (which stays owned by the caller). `name` appears in messages
  /// ("world", "data", ...); `timeout_s` is the deadline of every wait (<= 0: none).
  MpiCommunicator(MPI_Comm parent, std::string name, double timeout_s);
  /// Frees the duplicate (unless MPI is already finalized). Requests still pending on it
  /// must have been waited or the job be ending.
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  double timeout_s() const override { return timeout_s_; }
  /// Applies to collectives started afterwards; a started request keeps its deadline.
  void set_timeout_s(double seconds) override { timeout_s_ = seconds; }
  bool concurrent_progress() const override;

  Request iallreduce(void* buf, std::size_t count, DType type, ReduceOp op) override;
  /// `send` may equal `recv`: MPI_IN_PLACE, the result lands in its first recv_count.
  Request ireduce_scatter(const void* send, void* recv, std::size_t recv_count, DType type,
                          ReduceOp op) override;
  Request iallgather(const void* send, void* recv, std::size_t send_count, DType type) override;
  Request ibroadcast(void* buf, std::size_t count, DType type, int root) override;
  Request ibarrier() override;
  /// MPI_Ireduce_scatter in place; the result, which MPI leaves at the start of `buf`, is
  /// moved to this rank's block when the request completes (in test() or wait()).
  Request ireduce_scatter_blocks(void* buf, const std::vector<std::size_t>& counts, DType type,
                                 ReduceOp op) override;
  /// MPI_Iallgatherv in place.
  Request iallgather_blocks(void* buf, const std::vector<std::size_t>& counts, DType type) override;
  /// MPI_Isend / MPI_Irecv; `peer` must be another rank of the group.
  Request isend(const void* buf, std::size_t count, DType type, int peer, int tag) override;
  Request irecv(void* buf, std::size_t count, DType type, int peer, int tag) override;
  /// MPI_Ialltoall.
  Request ialltoall(const void* send, void* recv, std::size_t count, DType type) override;
  /// MPI_Ialltoallv (send and recv must not overlap).
  Request ialltoallv(const void* send, const std::vector<std::size_t>& send_counts, void* recv,
                     const std::vector<std::size_t>& recv_counts, DType type) override;

  /// The private duplicate, for libraries that take an MPI_Comm (parallel HDF5). Owned by
  /// this object: do not free it; collectives on it must not overlap ours.
  MPI_Comm mpi_comm() const { return comm_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::string name_;
  double timeout_s_;
  int rank_ = 0;
  int size_ = 1;
};

/// Factory used by the runtime: a Communicator over a duplicate of `comm`.
std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, std::string name,
                                                    double timeout_s);

/// The MPI communicator under `comm`; throws dst::Error if `comm` is not an
/// MpiCommunicator (e.g. an NCCL one).
MPI_Comm mpi_comm_of(const Communicator& comm);

namespace detail {

/// MPI datatype for elements of `type`. `for_reduction` rejects bf16/f16 (dst::Error
/// naming `what`); for pure data movement they map to MPI_UINT16_T.
MPI_Datatype mpi_datatype(DType type, bool for_reduction, const std::string& what);
MPI_Op mpi_op(ReduceOp op);

}  // namespace detail

}  // namespace dst::comm
