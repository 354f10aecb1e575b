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

namespace dst::app {

int run_check(runtime::Runtime& rt, const Command& cmd) {
  const config::RunConfig cfg =
      runtime::load_deck_collectively(rt, cmd.check.deck, cmd.check.overrides);
  rt.set_init_timeout_s(cfg.parallel.init_timeout_s);

  // Layout and back ends depend only on the deck, the world size and the build, so every
  // rank reaches the same verdict; report it once.
  config::Layout layout;
  runtime::Backends backends;
  std::string problem;
  try {
    layout = config::resolve_layout(cfg, rt.size());
    backends = runtime::resolve_backends(cfg, rt.device());
  } catch (const Error& e) {
    problem = e.what();
  }
  runtime::agree_or_fail(rt.world(), problem.empty(), "invalid run deck: " + problem, kExitDeck,
                         rt.init_timeout_s(), "layout");

  comm::ProcessGroups groups;
  {
    runtime::StartupStep step(rt.watchdog(), "process groups and test collective", 0.0);  // polled
    groups = comm::make_process_groups(rt.world(), layout, cfg.parallel.init_timeout_s);
    comm::verify_process_groups(groups);
  }
  DST_LOG(info, "dstrain " << core::version() << " (git " << core::git_hash() << ") check "
                           << cmd.check.deck);
  log::info(runtime::describe_layout(rt, layout, backends));
  if (rt.rank() == 0)
    for (const auto& note : config::advisories(cfg))
      log::warn(note);
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
