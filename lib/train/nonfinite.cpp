#include "train/nonfinite.hpp"

#include <algorithm>
#include <limits>
#include <sstream>

#include "comm/process_groups.hpp"
#include "train/grad_norm.hpp"

namespace dst::train {

namespace {
constexpr std::int64_t kNone = std::numeric_limits<std::int64_t>::max();
}  // namespace

std::size_t tensor_at(const model::ParamStore& ps, std::size_t offset) {
  std::size_t found = 0;
  for (std::size_t i = 0; i < ps.size(); ++i)
    if (ps.spec(i).offset <= offset) found = i;
  return found;
}

NonFiniteNamer::NonFiniteNamer(comm::Communicator& world, const config::Layout& layout,
                               const model::ParamStore& whole)
    : world_(world), layout_(layout), whole_(whole) {}

std::string NonFiniteNamer::name(
    const model::ParamStore& ps, const tensor::ExecContext& ctx, std::int64_t first_offset,
    const std::vector<std::pair<std::size_t, std::size_t>>& summed) const {
  std::int64_t first = first_offset >= 0 ? world_.rank() : kNone;
  world_.allreduce(&first, 1, DType::i64, comm::ReduceOp::min);
  std::ostringstream os;
  if (first != kNone) {
    // The owner names its tensor as the whole model's index and the element within it
    // (a tensor slice's element by its index in the whole tensor).
    std::int64_t where[2] = {-1, -1};
    if (world_.rank() == first) {
      const auto offset = static_cast<std::size_t>(first_offset);
      const std::size_t i = tensor_at(ps, offset);
      where[0] = static_cast<std::int64_t>(whole_.index_of(ps.spec(i).name));
      where[1] =
          static_cast<std::int64_t>(model::logical_index(ps.spec(i), offset - ps.spec(i).offset));
    }
    world_.allreduce(where, 2, DType::i64, comm::ReduceOp::max);
    const bool stages = layout_.pipeline > 1, slices = layout_.tensor > 1;
    const comm::RankCoords at = comm::rank_coords(static_cast<int>(first), layout_);
    os << "first on rank " << first;
    if (stages || slices)
      os << " (" << (stages ? "pipeline stage " + std::to_string(at.pipeline) : std::string())
         << (stages && slices ? ", " : "")
         << (slices ? "tensor slice " + std::to_string(at.tensor) : std::string()) << ")";
    os << ", tensor " << whole_.spec(static_cast<std::size_t>(where[0])).name << "[" << where[1]
       << "]";
    return os.str();
  }
  // The sums overflowed: each rank scans the sums it holds, the lowest tensor of the whole
  // model over every rank.
  std::int64_t tensor = kNone;
  for (const auto& [begin, end] : summed) {
    const NonFinite nf = first_nonfinite_grad(ctx, ps, begin, end);
    if (nf.found())
      tensor = std::min<std::int64_t>(
          tensor, static_cast<std::int64_t>(
                      whole_.index_of(ps.spec(static_cast<std::size_t>(nf.tensor)).name)));
  }
  world_.allreduce(&tensor, 1, DType::i64, comm::ReduceOp::min);
  os << "no rank's own gradient was non-finite (the sum overflowed); first tensor "
     << (tensor != kNone ? whole_.spec(static_cast<std::size_t>(tensor)).name : std::string("?"));
  return os.str();
}

}  // namespace dst::train
