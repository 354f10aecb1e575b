#include "session.hpp"

#include "core/error.hpp"
#include "core/exit_codes.hpp"
#include "core/log.hpp"
#include "core/version.hpp"

namespace dst::app {

Session start_session(runtime::Runtime& rt, const std::string& deck,
                      const std::vector<config::Override>& overrides, const std::string& what) {
  Session s;
  s.config = runtime::load_deck_collectively(rt, deck, overrides);
  rt.set_init_timeout_s(s.config.parallel.init_timeout_s);

  // Layout and back ends depend only on the deck, the world size and the build, so every
  // rank reaches the same verdict; report it once.
  std::string problem;
  try {
    s.layout = config::resolve_layout(s.config, rt.size());
    s.backends =
        runtime::resolve_backends(s.config, rt.device(), s.layout.data, rt.node().num_nodes);
  } catch (const Error& e) {
    problem = e.what();
  }
  runtime::agree_or_fail(rt.world(), problem.empty(), "invalid run deck: " + problem, kExitDeck,
                         rt.init_timeout_s(), "layout");
  {
    runtime::StartupStep step(rt.watchdog(), "process groups and test collective", 0.0);  // polled
    s.groups = comm::make_process_groups(rt.world(), s.layout, s.config.parallel.init_timeout_s);
    comm::verify_process_groups(s.groups);
    // From here on every collective runs under the training deadline.
    for (auto* g : {s.groups.world.get(), s.groups.data.get(), s.groups.tensor.get(),
                    s.groups.pipeline.get(), s.groups.expert.get(), s.groups.expert_data.get()})
      g->set_timeout_s(s.config.parallel.timeout_s);
  }
  DST_LOG(info, "dstrain " << core::version() << " (git " << core::git_hash() << ") " << what << " "
                           << deck);
  log::info(runtime::describe_layout(rt, s.layout, s.backends));
  if (!rt.node().cpu_crowding.empty()) log::warn(rt.node().cpu_crowding);
  if (rt.rank() == 0)
    for (const auto& note : config::advisories(s.config))
      log::warn(note);
  return s;
}

}  // namespace dst::app
