#include "comm/op_info.hpp"

#include <sstream>

namespace dst::comm {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::max:
      return "max";
    case ReduceOp::min:
      return "min";
  }
  return "?";
}

std::string describe_op(const char* backend, const OpInfo& info, const std::string& group,
                        int group_size) {
  std::ostringstream os;
  const auto elements = [&](std::size_t n) {
    os << n << " x " << dtype_name(info.type) << " (" << n * dtype_size(info.type) << " B)";
  };
  os << backend << ": ";
  switch (info.kind) {
    case OpKind::allreduce:
      os << "allreduce(" << reduce_op_name(info.op) << ") of ";
      elements(info.count);
      break;
    case OpKind::reduce_scatter:
      os << "reduce_scatter(" << reduce_op_name(info.op) << ") of ";
      elements(info.count * static_cast<std::size_t>(group_size));
      os << ", " << info.count << " per rank,";
      break;
    case OpKind::allgather:
      os << "allgather of ";
      elements(info.count);
      os << " per rank";
      break;
    case OpKind::reduce_scatter_blocks:
      os << "reduce_scatter(" << reduce_op_name(info.op) << ") of ";
      elements(info.count);
      os << " in blocks of unequal sizes, " << info.root << " to this rank,";
      break;
    case OpKind::allgather_blocks:
      os << "allgather of ";
      elements(info.count);
      os << " in blocks of unequal sizes, " << info.root << " from this rank,";
      break;
    case OpKind::alltoall:
      os << "alltoall of ";
      elements(info.count);
      os << " to each rank";
      break;
    case OpKind::alltoallv:
      os << "alltoallv of ";
      elements(info.count);
      os << " sent, " << info.root << " received,";
      break;
    case OpKind::broadcast:
      os << "broadcast from rank " << info.root << " of ";
      elements(info.count);
      break;
    case OpKind::barrier:
      os << "barrier";
      break;
    case OpKind::send:
      os << "send (tag " << info.tag << ") of ";
      elements(info.count);
      os << " to rank " << info.root;
      break;
    case OpKind::recv:
      os << "recv (tag " << info.tag << ") of ";
      elements(info.count);
      os << " from rank " << info.root;
      break;
  }
  os << " on group '" << group << "' (" << group_size << (group_size == 1 ? " rank)" : " ranks)");
  return os.str();
}

}  // namespace dst::comm
