#include "train/resume.hpp"

#include <algorithm>
#include <filesystem>

#include "core/exit_codes.hpp"
#include "runtime/mpi_collectives.hpp"

namespace dst::train {

namespace {

bool resumable(const std::string& path) {
  for (const std::string& k : resumable_keys()) {
    if (k.back() == '.' ? path.compare(0, k.size(), k) == 0 : path == k) return true;
  }
  return false;
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start < s.size()) {
    const std::size_t nl = s.find('\n', start);
    out.push_back(s.substr(start, nl == std::string::npos ? std::string::npos : nl - start));
    if (nl == std::string::npos) break;
    start = nl + 1;
  }
  return out;
}

/// Opens `file`, checks that this run may continue from it, and restores the trainer.
/// CheckpointError: the file is unusable (another may be); CollectiveError: this run
/// cannot continue from any checkpoint of that deck.
ResumeOutcome load(Trainer& trainer, const std::string& file, const config::RunConfig& cfg,
                   const std::string& tokenizer_name, comm::Communicator& world) {
  ckpt::Reader reader(comm::mpi_comm_of(world), file, cfg.parallel.timeout_s);
  const ckpt::Metadata& meta = reader.metadata();
  ResumeOutcome out;
  config::RunConfig saved;
  try {
    saved = config::load_deck_text(meta.deck_yaml, file + " (resolved deck)");
  } catch (const DeckError& e) {
    throw ckpt::CheckpointError(ckpt::CheckpointError::Kind::format,
                                "checkpoint '" + file + "': its deck cannot be read: " + e.what());
  }
  try {
    for (const auto& c : check_resume_deck(saved, cfg, file))
      out.notes.push_back("deck change on resume: " + c.path + ": " + c.from + " -> " + c.to);
  } catch (const DeckError& e) {
    throw CollectiveError(std::string("invalid run deck: ") + e.what(), kExitDeck);
  }
  if (!meta.tokenizer_name.empty() && meta.tokenizer_name != tokenizer_name)
    throw CollectiveError("cannot resume from '" + file + "': it was trained on tokenizer " +
                              meta.tokenizer_name + ", this run's data uses " + tokenizer_name,
                          kExitDeck);
  const std::int64_t batch = trainer.checkpoint_metadata().global_batch_size;
  if (meta.global_batch_size != batch)
    out.notes.push_back("the global batch changes from " + std::to_string(meta.global_batch_size) +
                        " to " + std::to_string(batch) + " sequences per step");
  if (meta.world_size != world.size())
    out.notes.push_back("resharded: saved by " + std::to_string(meta.world_size) +
                        " ranks, resumed on " + std::to_string(world.size()));
  trainer.restore(reader);
  out.file = file;
  out.step = meta.step;
  return out;
}

}  // namespace

const std::vector<std::string>& resumable_keys() {
  static const std::vector<std::string> keys = {
      "run.name",
      "run.output_dir",
      "data.train",
      "data.valid",
      "data.format",
      "data.text_separator",
      "training.max_steps",
      "training.stop_at_step",
      "training.micro_batch_size",
      "training.grad_accum_steps",
      "training.global_batch_size",
      "training.grad_clip",
      "parallel.",
      "kernels.",
      "checkpoint.",
      "logging.",
      "eval.",
      "debug.",
  };
  return keys;
}

std::vector<config::KeyChange> check_resume_deck(const config::RunConfig& saved,
                                                 const config::RunConfig& now,
                                                 const std::string& file) {
  std::vector<config::KeyChange> allowed, refused;
  for (auto& c : config::differences(saved, now))
    (resumable(c.path) ? allowed : refused).push_back(std::move(c));
  if (!refused.empty()) {
    std::string msg = "may not change on resume; cannot resume from '" + file +
                      "': the deck changes " + std::to_string(refused.size()) +
                      (refused.size() == 1 ? " key" : " keys") +
                      " that must stay as the checkpoint has them:";
    for (const auto& c : refused)
      msg += "\n  " + c.path + ": " + c.from + " in the checkpoint, " + c.to + " in this deck";
    msg +=
        "\n(start a new run with checkpoint.resume: none or another run.output_dir; the keys "
        "a resumed run may change are listed in docs/checkpoint.md)";
    throw DeckError(refused.front().path, "", msg);
  }
  return allowed;
}

ResumeOutcome resume_training(Trainer& trainer, ckpt::Directory& dir, const config::RunConfig& cfg,
                              const std::string& tokenizer_name, comm::Communicator& world) {
  const config::ResumeSetting& resume = cfg.checkpoint.resume;
  if (resume.kind == config::ResumeSetting::Kind::none) return {};
  if (resume.kind == config::ResumeSetting::Kind::path) {
    try {
      return load(trainer, resume.path, cfg, tokenizer_name, world);
    } catch (const ckpt::CheckpointError& e) {
      throw CollectiveError(std::string("cannot resume: ") + e.what(), kExitCheckpoint);
    }
  }
  // auto: `latest` first, then every committed checkpoint, newest first, as rank 0 lists
  // them; a failure to list reaches every rank.
  runtime::MpiCollectives coll(comm::mpi_comm_of(world), world.timeout_s(),
                               [&](const std::string& op) {
                                 return "checkpoint.resume auto in '" + dir.path() + "': " + op;
                               });
  runtime::RootResult listing;
  if (coll.rank() == 0) {
    listing = runtime::attempt([&] {
      std::vector<std::string> files;
      const std::string latest = dir.latest();
      if (!latest.empty()) files.push_back(latest);
      for (const std::string& f : dir.committed())
        if (std::find(files.begin(), files.end(), f) == files.end()) files.push_back(f);
      std::string text;
      for (const std::string& f : files)
        text += f + "\n";
      return text;
    });
  }
  listing = coll.broadcast_result(listing, 0, "broadcast of the checkpoint list");
  if (!listing.ok)
    throw CollectiveError(
        "cannot resume: listing the checkpoints in '" + dir.path() + "' failed: " + listing.text,
        kExitCheckpoint);
  const std::vector<std::string> candidates = split_lines(listing.text);
  std::vector<std::string> failures;
  for (const std::string& file : candidates) {
    try {
      ResumeOutcome out = load(trainer, file, cfg, tokenizer_name, world);
      for (auto it = failures.rbegin(); it != failures.rend(); ++it)
        out.notes.insert(out.notes.begin(), *it + "; falling back to an older checkpoint");
      return out;
    } catch (const ckpt::CheckpointError& e) {
      if (e.kind() == ckpt::CheckpointError::Kind::mismatch)
        throw CollectiveError(std::string("cannot resume: ") + e.what(), kExitDeck);
      failures.push_back(std::string("unusable checkpoint: ") + e.what());
    }
  }
  if (!failures.empty()) {
    std::string msg = "checkpoint.resume is auto but none of the " +
                      std::to_string(candidates.size()) + " checkpoints in '" + dir.path() +
                      "' can be loaded:";
    for (const auto& f : failures)
      msg += "\n  " + f;
    msg += "\n(move them away, or set checkpoint.resume: none to start afresh)";
    throw CollectiveError(msg, kExitCheckpoint);
  }
  return {};
}

}  // namespace dst::train
