#pragma once
/// \file op_info.hpp
/// What a collective is, kept by every back end's requests so that its description is
/// only built when a message needs it (a timeout, an error, the flight recorder): the
/// common path formats nothing.

#include <cstddef>
#include <string>

#include "comm/communicator.hpp"
#include "core/dtype.hpp"

namespace dst::comm {

/// Short name of a reduction: "sum", "max", "min".
const char* reduce_op_name(ReduceOp op);

enum class OpKind {
  allreduce,
  reduce_scatter,
  allgather,
  broadcast,
  barrier,
  reduce_scatter_blocks,  ///< count = every block together; root = this rank's block
  allgather_blocks,       ///< likewise
  send,                   ///< root = the peer (group rank); op unused
  recv,                   ///< likewise
  alltoall,               ///< count = elements to each rank
  alltoallv,              ///< count = elements sent in all; root = elements received
};

struct OpInfo {
  OpKind kind = OpKind::barrier;
  ReduceOp op = ReduceOp::sum;
  std::size_t count = 0;  ///< elements per rank in the operation's own terms (see describe_op)
  DType type = DType::u8;
  int root = 0;
  int tag = 0;  ///< send and recv
};

/// "<backend>: allreduce(sum) of 1024 x f32 (4096 B) on group 'data' (2 ranks)"; a
/// reduce_scatter counts the whole input and says how much each rank gets.
std::string describe_op(const char* backend, const OpInfo& info, const std::string& group,
                        int group_size);

}  // namespace dst::comm
