#include <cstdio>
#include <fstream>

#include "comm/process_groups.hpp"
#include "commands.hpp"
#include "core/error.hpp"
#include "core/exit_codes.hpp"
#include "core/log.hpp"
#include "core/version.hpp"
#include "model/plan.hpp"
#include "runtime/runtime.hpp"
#include "session.hpp"

namespace dst::app {

int run_check(runtime::Runtime& rt, const Command& cmd) {
  Session session = start_session(rt, cmd.check.deck, cmd.check.overrides, "check");
  const config::RunConfig& cfg = session.config;
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

  const model::Plan plan = model::make_plan(cfg, layout);
  // The smallest memory any rank has decides whether the plan fits.
  unsigned long long available = rt.device().available_bytes_per_rank;
  groups.world->allreduce(&available, 1, DType::u64, comm::ReduceOp::min);
  log::info(model::format_plan(cfg, layout, plan, available));

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
