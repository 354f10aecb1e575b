#pragma once
// The subcommands of the dstrain executable. Each returns the process exit code.

#include <functional>
#include <memory>

#include "cli.hpp"
#include "runtime/runtime.hpp"
// checkpoint tools
#include "ckpt/checkpoint.hpp"
#include "config/run_config.hpp"
#include "model/param_store.hpp"

namespace dst::app {

int run_version();
/// Runs under a started runtime (MPI, Kokkos are up).
int run_check(runtime::Runtime& rt, const Command& cmd);
int run_train(runtime::Runtime& rt, const Command& cmd);
/// `dstrain prep`: corpus -> token shards, in parallel over the ranks.
int run_prep(runtime::Runtime& rt, const Command& cmd);
// --- checkpoint tools ---
/// `dstrain inspect`: a checkpoint's metadata, tensors (checksums verified) and deck.
int run_inspect(runtime::Runtime& rt, const Command& cmd);
/// `dstrain export`: a checkpoint's parameters as safetensors + Hugging Face config.json.
int run_export(runtime::Runtime& rt, const Command& cmd);
/// `dstrain generate`: text from a checkpoint (KV-cache decoder, greedy or sampled).
int run_generate(runtime::Runtime& rt, const Command& cmd);
/// A checkpoint's model: the config of its stored deck and its parameters, read whole
/// (checksums verified) into a new store. Throws ckpt::CheckpointError for a deck that
/// does not parse or parameters that do not match the config (defined in cmd_export.cpp).
struct CheckpointModel {
  config::RunConfig config;
  std::unique_ptr<model::ParamStore> params;
};
CheckpointModel load_checkpoint_model(ckpt::Reader& reader);
/// Runs `body`, turning a ckpt::CheckpointError into a CollectiveError with exit code
/// kExitCheckpoint (printed once by rank 0; every rank reads the same file alike).
int with_checkpoint_errors(const std::function<int()>& body);
// --- end checkpoint tools ---
/// `dstrain tokenize`: a filter from stdin to stdout. Needs no MPI or Kokkos.
int run_tokenize(const TokenizeOptions& options);

}  // namespace dst::app
