#pragma once
/// \file resume.hpp
/// Continuing a run from a checkpoint (checkpoint.resume: auto | none | a path), and the
/// rule of which deck keys a resumed run may change (docs/checkpoint.md, "resuming").

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/checkpoint.hpp"
#include "comm/communicator.hpp"
#include "comm/mpi_communicator.hpp"
#include "config/deck.hpp"
#include "config/run_config.hpp"
#include "train/trainer.hpp"

namespace dst::train {

/// The deck keys a resumed run may change: exact paths, or prefixes ending in '.' for a
/// whole section. Every other key (model shape, seed, sequence length, precision,
/// optimizer and schedule) must equal the checkpoint's.
const std::vector<std::string>& resumable_keys();

/// Compares the checkpoint's deck with this run's. Returns the changes that are allowed
/// (for the log); throws DeckError listing every key that may not change, with both
/// values, naming `file`.
std::vector<config::KeyChange> check_resume_deck(const config::RunConfig& saved,
                                                 const config::RunConfig& now,
                                                 const std::string& file);

/// What resume_training did.
struct ResumeOutcome {
  std::string file;                ///< the checkpoint loaded; "" = a fresh start
  std::int64_t step = 0;           ///< steps completed in it (the next step is step + 1)
  std::vector<std::string> notes;  ///< for the log: fallbacks, allowed deck changes
};

/// Carries out cfg.checkpoint.resume (collective over `world`; `dir` over the same ranks):
///  - none: a fresh start;
///  - a path: loads that file, or throws CollectiveError(kExitCheckpoint);
///  - auto: the checkpoint `latest` names, then the other committed ones newest first,
///    falling back past damaged ones (each named in notes); a fresh start when there is
///    none; CollectiveError(kExitCheckpoint) when there are some but none loads.
/// A deck that may not resume from a checkpoint (check_resume_deck), or data with another
/// tokenizer, ends with CollectiveError(kExitDeck) whatever the mode: an older
/// checkpoint would not suit it either. Every rank decides alike: rank 0 lists the
/// directory and broadcasts the candidates.
ResumeOutcome resume_training(Trainer& trainer, ckpt::Directory& dir, const config::RunConfig& cfg,
                              const std::string& tokenizer_name, comm::Communicator& world);

}  // namespace dst::train
