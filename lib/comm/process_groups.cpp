#include "comm/process_groups.hpp"

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "comm/mpi_communicator.hpp"
#include "core/error.hpp"
#include "runtime/mpi_check.hpp"

namespace dst::comm {

namespace {

std::string layout_text(const config::Layout& layout) {
  std::ostringstream os;
  os << "data=" << layout.data << " tensor=" << layout.tensor << " pipeline=" << layout.pipeline;
  return os.str();
}

/// Splits `world` by `color` (ordered by `key`) and wraps the result; checks that the new
/// group has the size and this rank the position the layout says.
std::unique_ptr<Communicator> split_group(MPI_Comm world, int color, int key, int expected_size,
                                          const std::string& name, double timeout_s) {
  MPI_Comm split = MPI_COMM_NULL;
  DST_MPI_CHECK(MPI_Comm_split(world, color, key, &split));
  std::unique_ptr<Communicator> group;
  try {
    // The communicator keeps its own duplicate; the split itself is freed below.
    group = make_mpi_communicator(split, name, timeout_s);
  } catch (...) {
    MPI_Comm_free(&split);
    throw;
  }
  DST_MPI_CHECK(MPI_Comm_free(&split));
  if (group->size() != expected_size || group->rank() != key) {
    std::ostringstream os;
    os << "comm: splitting the world into '" << name << "' groups gave this rank position "
       << group->rank() << " of " << group->size() << ", expected " << key << " of "
       << expected_size;
    throw Error(os.str());
  }
  return group;
}

std::vector<std::int32_t> expected_members(const ProcessGroups& g, const std::string& which,
                                           int world_rank) {
  config::Layout layout;
  layout.data = g.data_size;
  layout.tensor = g.tensor_size;
  layout.pipeline = g.pipeline_size;
  layout.world_size = g.data_size * g.tensor_size * g.pipeline_size;
  std::vector<std::int32_t> members;
  if (which == "world") {
    for (int r = 0; r < layout.world_size; ++r)
      members.push_back(r);
    return members;
  }
  const RankCoords me = rank_coords(world_rank, layout);
  const int n = which == "data" ? layout.data : which == "tensor" ? layout.tensor : layout.pipeline;
  for (int i = 0; i < n; ++i) {
    RankCoords c = me;
    (which == "data" ? c.data : which == "tensor" ? c.tensor : c.pipeline) = i;
    members.push_back(world_rank_of(c, layout));
  }
  return members;
}

std::string list_text(const std::vector<std::int32_t>& v) {
  std::ostringstream os;
  os << "[";
  for (std::size_t i = 0; i < v.size(); ++i)
    os << (i ? " " : "") << v[i];
  os << "]";
  return os.str();
}

}  // namespace

RankCoords rank_coords(int world_rank, const config::Layout& layout) {
  RankCoords c;
  c.tensor = world_rank % layout.tensor;
  c.data = (world_rank / layout.tensor) % layout.data;
  c.pipeline = world_rank / (layout.tensor * layout.data);
  return c;
}

int world_rank_of(const RankCoords& c, const config::Layout& layout) {
  return (c.pipeline * layout.data + c.data) * layout.tensor + c.tensor;
}

ProcessGroups make_process_groups(MPI_Comm world, const config::Layout& layout, double timeout_s) {
  if (layout.data < 1 || layout.tensor < 1 || layout.pipeline < 1)
    throw Error("comm: process groups: every group size must be >= 1, got " + layout_text(layout));
  int world_size = 0;
  int world_rank = 0;
  DST_MPI_CHECK(MPI_Comm_size(world, &world_size));
  DST_MPI_CHECK(MPI_Comm_rank(world, &world_rank));
  const long product = static_cast<long>(layout.data) * layout.tensor * layout.pipeline;
  if (product != world_size)
    throw Error("comm: process groups: layout " + layout_text(layout) + " needs " +
                std::to_string(product) + " ranks but the job has " + std::to_string(world_size));
  if (layout.world_size != world_size)
    throw Error("comm: process groups: layout was resolved for " +
                std::to_string(layout.world_size) + " ranks but the job has " +
                std::to_string(world_size));

  ProcessGroups g;
  const RankCoords me = rank_coords(world_rank, layout);
  g.data_rank = me.data;
  g.tensor_rank = me.tensor;
  g.pipeline_rank = me.pipeline;
  g.data_size = layout.data;
  g.tensor_size = layout.tensor;
  g.pipeline_size = layout.pipeline;

  g.world = make_mpi_communicator(world, "world", timeout_s);
  // Colour = the coordinates a group shares, key = the one it varies in (its rank order).
  g.data = split_group(world, me.pipeline * layout.tensor + me.tensor, me.data, layout.data, "data",
                       timeout_s);
  g.tensor = split_group(world, me.pipeline * layout.data + me.data, me.tensor, layout.tensor,
                         "tensor", timeout_s);
  g.pipeline = split_group(world, me.data * layout.tensor + me.tensor, me.pipeline, layout.pipeline,
                           "pipeline", timeout_s);
  // Expert groups: consecutive data ranks of one data group (the same pipeline and tensor
  // coordinates), and across them the ranks holding the same experts.
  const int X = layout.expert;
  if (X < 1 || layout.data % X != 0)
    throw Error("comm: process groups: parallel.expert " + std::to_string(X) +
                " does not divide the data-parallel ranks (" + std::to_string(layout.data) + ")");
  const int outer = me.pipeline * layout.tensor + me.tensor;
  g.expert_rank = me.data % X;
  g.expert_size = X;
  g.expert = split_group(world, outer * (layout.data / X) + me.data / X, me.data % X, X, "expert",
                         timeout_s);
  g.expert_data = split_group(world, outer * X + me.data % X, me.data / X, layout.data / X,
                              "expert_data", timeout_s);
  // Replicated key/value heads: consecutive tensor ranks, so consecutive world ranks.
  const int R = layout.kv_replicas;
  if (R < 1 || layout.tensor % R != 0)
    throw Error("comm: process groups: " + std::to_string(R) +
                " ranks sharing each key/value head do not divide parallel.tensor " +
                std::to_string(layout.tensor));
  g.kv_replica = split_group(world, world_rank / R, me.tensor % R, R, "kv_replica", timeout_s);
  return g;
}

void verify_process_groups(ProcessGroups& groups) {
  DST_REQUIRE(groups.world && groups.data && groups.tensor && groups.pipeline,
              "comm: verify_process_groups: the groups have not been made");
  const int world_rank = groups.world->rank();
  Communicator* const all[] = {groups.world.get(), groups.data.get(), groups.tensor.get(),
                               groups.pipeline.get()};
  // The expert and kv_replica groups (when made): every member takes part; their membership is that
  // of make_process_groups's split, checked there by size and position.
  for (Communicator* group :
       {groups.expert.get(), groups.expert_data.get(), groups.kv_replica.get()}) {
    if (!group) continue;
    const auto counted = group->allreduce_value<std::int32_t>(1, ReduceOp::sum);
    if (counted != group->size())
      throw Error("comm: start-up check of group '" + group->name() +
                  "': " + std::to_string(counted) +
                  " ranks took part in a test allreduce but the group has " +
                  std::to_string(group->size()));
  }
  for (Communicator* group : all) {
    const std::string& name = group->name();
    const auto counted = group->allreduce_value<std::int32_t>(1, ReduceOp::sum);
    if (counted != group->size())
      throw Error("comm: start-up check of group '" + name + "': " + std::to_string(counted) +
                  " ranks took part in a test allreduce but the group has " +
                  std::to_string(group->size()));
    const std::vector<std::int32_t> expected = expected_members(groups, name, world_rank);
    std::vector<std::int32_t> members(static_cast<std::size_t>(group->size()), -1);
    const std::int32_t mine = world_rank;
    group->allgather(&mine, members.data(), 1, DType::i32);
    if (members != expected)
      throw Error("comm: start-up check of group '" + name + "' on world rank " +
                  std::to_string(world_rank) + ": members are world ranks " + list_text(members) +
                  ", expected " + list_text(expected));
  }
}

}  // namespace dst::comm
