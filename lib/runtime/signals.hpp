#pragma once
/// \file signals.hpp
/// Stop requests by signal (docs/operations.md): SIGUSR1 (what Slurm's `--signal` and
/// `mpirun` forward), SIGTERM (what Slurm sends every task at pre-emption or time limit)
/// and SIGINT (a terminal's Ctrl-C) only record that a stop was asked for. The training
/// loop reads the record at each step boundary, all ranks agree on it in the step's
/// existing all-reduce, save a checkpoint and exit with kExitPreempted. Further signals
/// while that happens are recorded and otherwise ignored, so a second signal cannot
/// interrupt the checkpoint being written.

#include <string>

namespace dst::runtime {

/// Installs the handlers (idempotent; async-signal-safe: they store one integer).
void install_stop_handlers();
/// Ignores SIGXFSZ: a write past a file-size limit (`ulimit -f`, a batch system's) then
/// fails with EFBIG, which the writers report as an error naming the file, instead of the
/// signal killing the rank that crossed the limit without a word.
void ignore_file_size_signal();
/// The first stop signal received (its number), 0 if none.
int stop_signal();
/// How many stop signals were received.
int stop_signal_count();
/// "SIGUSR1", "SIGTERM", "SIGINT", or "signal N".
std::string signal_name(int signo);
/// Forgets received signals (tests).
void reset_stop_signal();

}  // namespace dst::runtime
