#pragma once
/// \file consistency.hpp
/// The cross-rank parameter check (debug.consistency_every): every copy of every parameter
/// holds the same bits. A rank's tensors have replicas in up to four places, each compared
/// the same way (fingerprints gathered over the group of replicas, the lowest tensor of the
/// whole model that differs found over every rank, the differing ranks named, every rank
/// throwing alike):
///  - its data group (the ranks holding the same stage and slice);
///  - its tensor group, for the tensors every slice holds whole (the norms) and the slices
///    several tensor ranks share (replicated key/value heads);
///  - its expert-data group, for its own routed experts (expert parallelism's storage);
///  - the two ends of the pipeline, for the embedding table's copy on the last stage (tied
///    embeddings or the MTP module).

#include <cstdint>
#include <vector>

#include "comm/process_groups.hpp"
#include "config/run_config.hpp"
#include "model/param_store.hpp"
#include "tensor/context.hpp"

namespace dst::train {

/// FNV-1a over the bytes of `n` floats: a cheap fingerprint to compare across ranks.
std::uint64_t fingerprint(const float* p, std::size_t n);

class ConsistencyChecker {
 public:
  /// Where this rank's tensors stand beyond the data group.
  struct Replicas {
    int stage = 0;  ///< this rank's pipeline stage (layout.pipeline stages)
    /// The whole model's layout (names and whole shapes): names the tensors when stages,
    /// tensor slices or own experts make the stores differ; may be null otherwise.
    const model::ParamStore* whole = nullptr;
    /// Expert parallelism's storage: this rank holds its own routed experts, the store's
    /// tensors from own_experts_from on (`own_experts` false: none), and whether any stage
    /// does (their check is then collective over every rank).
    bool own_experts = false;
    std::size_t own_experts_from = 0;
    bool any_stage_own_experts = false;
    /// Tied embeddings or the MTP module with stages: the last stage holds a copy of the
    /// embedding table (`tied`: read by the tied head, else by the MTP module).
    bool shared_embedding = false;
    bool tied = false;
  };
  /// `groups` must outlive the checker.
  ConsistencyChecker(comm::ProcessGroups& groups, const config::Layout& layout, Replicas replicas);

  /// Compares `ps`'s parameters (this rank's store; host or device memory of `ctx`) with
  /// every replica's. Throws CollectiveError (exit 6, kExitDiverged) on every rank alike,
  /// naming step `step`, the lowest tensor of the whole model that differs, the rank whose
  /// copy is the reference and the ranks that differ from it. Collective over every rank.
  void check(const model::ParamStore& ps, const tensor::ExecContext& ctx, std::int64_t step) const;

 private:
  /// Each pattern over `prints`, this rank's fingerprints in store order.
  void check_slices(const model::ParamStore& ps, const std::vector<std::uint64_t>& prints,
                    std::int64_t step) const;
  void check_data_replicas(const model::ParamStore& ps, const std::vector<std::uint64_t>& prints,
                           std::int64_t step) const;
  void check_experts(const model::ParamStore& ps, const std::vector<std::uint64_t>& prints,
                     std::int64_t step) const;
  void check_embedding_copies(const model::ParamStore& ps, const std::vector<std::uint64_t>& prints,
                              std::int64_t step) const;

  comm::ProcessGroups& groups_;
  config::Layout layout_;
  Replicas replicas_;
};

}  // namespace dst::train
