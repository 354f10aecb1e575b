#include <cstdio>
#include <fstream>

#include "comm/process_groups.hpp"
#include "commands.hpp"
#include "core/error.hpp"
#include "core/exit_codes.hpp"
#include "core/log.hpp"
#include "core/version.hpp"
#include "model/plan.hpp"
#include "plan_text.hpp"
#include "runtime/runtime.hpp"
#include "session.hpp"
#include "train/plan.hpp"

namespace dst::app {

int run_check(runtime::Runtime& rt, const Command& cmd) {
  // --ranks with pipeline stages, tensor slices or expert groups: the launched ranks (often
  // one) start as data ranks of one stage and slice, each holding every expert; the deck as
  // given is planned for the --ranks layout below.
  std::vector<config::Override> launch = cmd.check.overrides;
  if (cmd.check.plan_ranks > 0)
    for (const char* o :
         {"parallel.pipeline=1", "parallel.pipeline_layers=[]", "parallel.tensor=1",
          "parallel.sequence_parallel=false", "parallel.expert=1", "parallel.data=auto"})
      launch.push_back(config::parse_override(o));
  Session session = start_session(rt, cmd.check.deck, launch, "check");
  const config::RunConfig cfg =
      cmd.check.plan_ranks > 0
          ? runtime::load_deck_collectively(rt, cmd.check.deck, cmd.check.overrides)
          : session.config;
  const config::Layout& layout = session.layout;
  comm::ProcessGroups& groups = session.groups;
  const std::string resolved = config::to_yaml(cfg);
  log::info("resolved deck:\n" + resolved);
  if (!cmd.check.deck_out.empty() && rt.rank() == 0) {
    std::ofstream out(cmd.check.deck_out);
    out << resolved;
    if (!out.flush())
      throw Error("check: cannot write the resolved deck to '" + cmd.check.deck_out + "'");
  }

  // --ranks: the layout of that many ranks, planned here; the launched ranks were checked
  // above (start-up, process groups) on their own layout.
  const config::Layout planned =
      cmd.check.plan_ranks > 0 ? config::resolve_layout(cfg, cmd.check.plan_ranks) : layout;
  train::PlanOptions options;
  options.zero_stage = cfg.parallel.zero_stage;
  options.bucket_copies = session.backends.comm != runtime::CommBackend::shm;
  const std::string& gpu = rt.device().name;
  if (!cmd.check.host.empty())
    options.host = cmd.check.host;
  else if (session.backends.kernels == ComputeBackend::cuda)
    options.host = gpu.find("H200") != std::string::npos ? "h200" : "h100";
  else
    options.host = session.backends.comm == runtime::CommBackend::mpi ? "cpu-mpi" : "cpu";
  const train::Plan plan = train::make_plan(cfg, planned, options);
  // The smallest memory any rank has decides whether the plan fits; a planned layout
  // of other ranks is compared with its host kind's device.
  unsigned long long available = rt.device().available_bytes_per_rank;
  groups.world->allreduce(&available, 1, DType::u64, comm::ReduceOp::min);
  if (cmd.check.plan_ranks > 0)
    available = static_cast<unsigned long long>(train::host_rates(options.host).memory_gib *
                                                1024.0 * 1024.0 * 1024.0);
  log::info(format_plan(cfg, planned, plan, available));

  if (available > 0 && plan.memory.total() > available) {
    const std::string msg = "the plan needs " +
                            model::format_bytes(static_cast<double>(plan.memory.total())) +
                            " per rank but a rank has " +
                            model::format_bytes(static_cast<double>(available)) + " available";
    if (!cmd.check.force) {
      if (rt.rank() == 0)
        log::error(msg + " (use more ranks, a smaller model or micro-batch, or --force)");
      return kExitPlan;
    }
    log::warn(msg + " (--force given)");
  }
  log::info("check: deck is valid and the layout works");
  return kExitOk;
}

}  // namespace dst::app
