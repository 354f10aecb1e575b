#include <cblas.h>

#include <cstdlib>

#include "commands.hpp"
#include "runtime/signals.hpp"
#include "session.hpp"
#include "train/training_run.hpp"

namespace dst::app {

int run_train(runtime::Runtime& rt, const Command& cmd) {
  // One BLAS thread per rank (one rank per core is the CPU layout) unless the user says
  // otherwise; the MFU peak is per core too.
  if (!std::getenv("OPENBLAS_NUM_THREADS") && !std::getenv("OMP_NUM_THREADS"))
    openblas_set_num_threads(1);
  // A stop signal from here on ends the run at the next step boundary with a checkpoint.
  runtime::install_stop_handlers();
  Session session = start_session(rt, cmd.check.deck, cmd.check.overrides, "train");
  train::TrainingRun run(rt, session.config, session.layout, session.backends, session.groups);
  return run.run();
}

}  // namespace dst::app
