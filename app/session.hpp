#pragma once
// The start-up every parallel command shares, after the runtime is up: the deck read on
// rank 0 and broadcast, the layout and back ends resolved (a deck error is reported
// once), the process groups made and tested with a collective, the layout logged.

#include <string>
#include <vector>

#include "comm/process_groups.hpp"
#include "config/deck.hpp"
#include "runtime/runtime.hpp"

namespace dst::app {

struct Session {
  config::RunConfig config;
  config::Layout layout;
  runtime::Backends backends;
  comm::ProcessGroups groups;
};

Session start_session(runtime::Runtime& rt, const std::string& deck,
                      const std::vector<config::Override>& overrides, const std::string& what);

}  // namespace dst::app
