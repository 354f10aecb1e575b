// dstrain: parse the command line, run the subcommand. The one place errors are caught:
// a library error on any rank is printed as `[rank R] error: ...` and ends the job.
#include <cstdio>
#include <exception>

#include "blas/host_blas.hpp"
#include "cli.hpp"
#include "commands.hpp"
#include "core/error.hpp"
#include "core/exit_codes.hpp"
#include "core/log.hpp"
#include "runtime/runtime.hpp"
#include "runtime/signals.hpp"

namespace {

/// Starts the runtime and runs `body` in it. Errors are handled while MPI is still up:
/// a failure every rank agreed on (JobFailed) was reported once and ends the run
/// normally with its code; any other error on any rank aborts the whole job from that
/// rank, naming it. (Unwinding past the runtime first would finalise MPI on one rank
/// while the others wait for it.)
template <class Body>
int run_parallel(int& argc, char**& argv, const dst::app::Command& cmd, Body body) {
  using namespace dst;
  int code = kExitError;
  try {
    runtime::Runtime rt(argc, argv, cmd.common.init_timeout_s);
    try {
      code = body(rt, cmd);
    } catch (const runtime::JobFailed& f) {
      code = f.exit_code();
    } catch (const CollectiveError& e) {  // every rank has it: print once, end normally
      if (rt.rank() == 0) log::error(e.what());
      code = e.exit_code();
    } catch (const TimeoutError& e) {
      runtime::abort_job(e.what(), kExitTimeout);
    } catch (const DeckError& e) {
      runtime::abort_job(std::string("invalid run deck: ") + e.what(), kExitDeck);
    } catch (const std::exception& e) {
      runtime::abort_job(e.what(), kExitError);
    }
  } catch (const std::exception& e) {  // start-up itself failed
    runtime::abort_job(std::string("start-up failed: ") + e.what(), kExitError);
  }
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace dst;
  // First of all: it may start this program again with other OpenBLAS kernels.
  blas::select_host_kernels(argv);
  // Before MPI is up, the launcher's environment tells which rank we are, so usage errors
  // under `mpirun -np 8` are printed once (by rank 0), not eight times.
  const int env_rank = runtime::rank_from_environment();
  log::set_rank(env_rank);
  app::Command cmd;
  try {
    cmd = app::parse_command_line(argc, argv);
  } catch (const Error& e) {
    if (env_rank <= 0) std::fprintf(stderr, "dstrain: error: %s\n", e.what());
    return dynamic_cast<const DeckError*>(&e) ? kExitDeck : kExitUsage;
  }
  log::set_level(cmd.common.log_level);
  runtime::ignore_file_size_signal();

  switch (cmd.kind) {
    case app::Command::Kind::tokenize:  // a plain filter (stdin to stdout): no MPI, no Kokkos
      return app::run_tokenize(cmd.tokenize);
    case app::Command::Kind::help:
      if (env_rank <= 0) std::fputs(app::help_text(cmd.help_topic).c_str(), stdout);
      return kExitOk;
    case app::Command::Kind::version:
      if (env_rank <= 0) return app::run_version();
      return kExitOk;
    case app::Command::Kind::check:
      return run_parallel(argc, argv, cmd, app::run_check);
    case app::Command::Kind::train:
      return run_parallel(argc, argv, cmd, app::run_train);
    case app::Command::Kind::prep:
      return run_parallel(argc, argv, cmd, app::run_prep);
    // checkpoint tools: single-process by default (an MPI singleton)
    case app::Command::Kind::inspect:
      return run_parallel(argc, argv, cmd, app::run_inspect);
    case app::Command::Kind::export_:
      return run_parallel(argc, argv, cmd, app::run_export);
    case app::Command::Kind::generate:
      return run_parallel(argc, argv, cmd, app::run_generate);
  }
  return kExitError;
}
