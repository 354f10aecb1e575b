#pragma once
/// \file checkpoint.hpp
/// Collective HDF5 checkpoints (docs/checkpoint.md): one file per checkpoint, every
/// tensor stored whole under its name, written by all ranks together through MPI-IO,
/// committed atomically (write .tmp, fsync, rename, manifest, `latest` pointer), and
/// verified on load (the manifest's whole-file hash before libhdf5 sees the file, then
/// the format version, then a per-dataset checksum of the logical tensor).
///
/// The layer knows nothing of models or optimizers: the trainer hands it named f32
/// tensors (replicated on every rank of the communicator, as data-parallel parameters
/// and moments are) and a Metadata record, and gets them back.

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.hpp"

namespace dst::ckpt {

/// Version of the checkpoint file format (docs/checkpoint.md); bumped on any change a
/// reader must know about.
inline constexpr int kFormatVersion = 1;
/// Version of the manifest written beside each checkpoint.
inline constexpr int kManifestVersion = 1;

/// A checkpoint that cannot be used: missing, damaged (hash or checksum mismatch),
/// foreign, of another format version, or not matching what the caller expects. The
/// message names the file and, for a checksum, the tensor.
class CheckpointError : public Error {
 public:
  enum class Kind { missing, manifest, format, checksum, mismatch, io };
  CheckpointError(Kind kind, const std::string& what) : Error(what), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

/// Everything but the tensors. Stored as attributes of the root group (scalars) and
/// small datasets under /meta (texts); see docs/checkpoint.md for the names.
struct Metadata {
  int format_version = kFormatVersion;
  std::int64_t step = 0;             ///< optimizer steps completed (the next is step + 1)
  std::uint64_t epoch = 0;           ///< sampler position: epoch ...
  std::uint64_t consumed = 0;        ///< ... and samples consumed within it
  std::uint64_t samples_seen = 0;    ///< samples consumed since the start of training
  std::int64_t optimizer_steps = 0;  ///< AdamW's t (steps applied, skipped ones excluded)
  std::int64_t skipped_steps = 0;    ///< steps skipped for non-finite gradients
  std::uint64_t seed = 0;            ///< run.seed
  std::string rng;                   ///< RNG state in words (counter-based: seed + stream)
  double loss_scale = 1.0;           ///< fp16 dynamic loss scale (1 without one)
  std::int64_t loss_scale_clean_steps = 0;
  std::string deck_yaml;         ///< the resolved deck (config::to_yaml)
  std::string tokenizer_name;    ///< the data's tokenizer identity ("byte260", "bpe-…")
  std::string tokenizer_json;    ///< its tokenizer.json text when the run has it, else ""
  std::string software_version;  ///< "dstrain <version> (git <hash>)"
  std::string created_utc;       ///< ISO 8601, filled by save()
  // The world layout at save time.
  std::int64_t world_size = 1, data_parallel = 1, tensor_parallel = 1, pipeline_parallel = 1;
  std::int64_t global_batch_size = 0, micro_batch_size = 0, grad_accum_steps = 0;
};

/// A tensor to save: its HDF5 path relative to the file's root (e.g.
/// "params/model.embed_tokens.weight", "optimizer/exp_avg/model.norm.weight"), its
/// logical shape, and its full data, identical on every rank.
struct TensorRef {
  std::string name;
  std::vector<std::int64_t> shape;
  const float* data = nullptr;
};

/// Elements of a tensor of `shape` (1 for a scalar).
std::uint64_t element_count(const std::vector<std::int64_t>& shape);
/// A shape as `dstrain inspect` and the checkpoint's messages write it: "(260, 64)",
/// "(64,)", "()".
std::string shape_text(const std::vector<std::int64_t>& shape);

/// A tensor stored in a checkpoint.
struct TensorInfo {
  std::string name;
  std::vector<std::int64_t> shape;
  std::string dtype;           ///< "f32"
  std::uint64_t checksum = 0;  ///< stored checksum (docs/checkpoint.md, "checksums")
};

/// What a save or load did, for the log line (bandwidths in GB/s = 1e9 bytes/s).
struct IoStats {
  std::string path;
  std::uint64_t bytes = 0;            ///< file size
  std::uint64_t bytes_this_rank = 0;  ///< tensor bytes this rank wrote / read from the file
  double seconds = 0.0;               ///< write or read, through fsync/close
  double hash_seconds = 0.0;          ///< whole-file hash (save: for the manifest; load: check)
  double total_seconds = 0.0;         ///< everything, commit included
  bool collective = false;            ///< H5Pget_mpio_actual_io_mode said collective
  double gbps() const { return seconds > 0 ? bytes / seconds / 1e9 : 0.0; }
};

/// How the file is laid out and how MPI-IO moves it (docs/checkpoint.md, "tuning"). The
/// defaults are the measured choice; benchmarks/ckpt compares the alternatives.
struct IoOptions {
  /// H5Pset_alignment: every object of at least this many bytes starts at a multiple of
  /// it, so a tensor's first byte falls on a file-system block / stripe boundary.
  /// 1 = no alignment.
  std::uint64_t alignment = std::uint64_t{1} << 20;
  /// MPI_Info hints handed to MPI_File_open through H5Pset_fapl_mpio, e.g.
  /// {"romio_cb_write", "enable"}, {"cb_buffer_size", "16777216"}, {"striping_unit", ...}.
  /// Hints a given MPI-IO implementation does not know are ignored by it.
  std::vector<std::pair<std::string, std::string>> mpi_hints;
};

/// Test hook (debug.inject_exit_in_checkpoint): rank `rank` calls _exit(kExitInjected)
/// after writing part of the tensors, leaving a .tmp file behind.
struct SaveFaults {
  int exit_rank = -1;
};

/// Bytes per checksum block (1 MiB): large enough that the digests are a negligible
/// second pass, small enough that every rank gets blocks of a large tensor to hash.
inline constexpr std::uint64_t kChecksumBlockBytes = std::uint64_t{1} << 20;

/// The checksum of a logical f32 tensor (docs/checkpoint.md): xxh64 (seed 0) of each
/// 1 MiB block of its little-endian bytes, then xxh64 of the concatenated block digests
/// (u64 little-endian). Independent of how the tensor was split between writers. A
/// tensor of 0 elements has no blocks: its checksum is xxh64 of 0 bytes.
std::uint64_t tensor_checksum(const float* data, std::uint64_t elements);

/// xxh64 (seed 0) of one block: the piece of tensor_checksum a rank computes for the
/// blocks it was given; `bytes` <= kChecksumBlockBytes.
std::uint64_t block_digest(const void* data, std::uint64_t bytes);
/// The second stage of tensor_checksum: xxh64 of the digests' little-endian bytes.
std::uint64_t combine_block_digests(const std::vector<std::uint64_t>& digests);

/// A checkpoint directory: step-<N>.h5 files, their step-<N>.manifest.json, `latest`.
/// Every member function is collective over `comm` unless it says otherwise.
class Directory {
 public:
  /// `comm`: the ranks that write and read together (all of them: every rank holds the
  /// replicated tensors). Nothing is touched on disk until a call says so.
  Directory(MPI_Comm comm, std::string path, double timeout_s);

  const std::string& path() const { return path_; }

  /// Layout and MPI-IO hints of later saves (all ranks alike).
  void set_io_options(IoOptions io) { io_ = std::move(io); }

  /// Removes leftover step-*.h5.tmp files of an interrupted save (rank 0, with a
  /// warning naming each); returns how many. Creates the directory if it is missing.
  int clean_leftovers();

  /// Writes step-<meta.step>.h5 with every tensor and the metadata, collectively (each
  /// rank writes about 1/size of the tensor bytes), then commits it atomically: close,
  /// fsync, rename from .tmp, manifest (size + whole-file xxh64), `latest` updated by
  /// write-then-rename, and finally prunes committed checkpoints beyond `keep_last`
  /// (0 = keep all). Throws CheckpointError (same on every rank) on failure, leaving the
  /// previous checkpoints untouched.
  IoStats save(Metadata meta, const std::vector<TensorRef>& tensors, std::int64_t keep_last,
               SaveFaults faults = {});
  /// The tensors of a streamed save, one at a time: `source(i)` is called collectively
  /// (every rank, i = 0, 1, ... in order) and returns tensor i's whole data, identical on
  /// every rank and valid until the next call. A caller whose tensors are spread over the
  /// ranks (slices, stages, shards) assembles one tensor at a time, so a save needs one
  /// tensor's memory, not the whole state's.
  using TensorSource = std::function<const float*(std::size_t)>;
  /// save() with the data from `source` (the TensorRefs give the names and shapes; their
  /// data is not read). The file is the same as save()'s of the same tensors.
  IoStats save(Metadata meta, const std::vector<TensorRef>& tensors, const TensorSource& source,
               std::int64_t keep_last, SaveFaults faults = {});

  /// Committed checkpoints (paths of step-<N>.h5 that have their manifest), newest
  /// (highest step) first; no I/O beyond listing the directory. Not collective.
  std::vector<std::string> committed() const;
  /// The path of the file `latest` names (path()/step-<N>.h5), or "" when there is no
  /// `latest`. Not collective; the file itself is not checked (Reader does that).
  std::string latest() const;

 private:
  IoStats save_impl(Metadata meta, const std::vector<TensorRef>& tensors,
                    const TensorSource* source, std::int64_t keep_last, SaveFaults faults);

  MPI_Comm comm_;
  std::string path_;
  double timeout_s_;
  IoOptions io_;
};

/// An open, verified checkpoint file. Opening (collective) checks, in this order: the
/// manifest beside the file exists and its size and whole-file xxh64 match (the file is
/// not handed to libhdf5 otherwise), the format version, and the presence of the
/// metadata. Per-tensor checksums are checked by read().
class Reader {
 public:
  /// `timeout_s` bounds every wait of ours, including the other ranks' wait while rank 0
  /// hashes the whole file: size it for the file (about 1 s per GB from disk).
  Reader(MPI_Comm comm, const std::string& file, double timeout_s, const IoOptions& io = {});
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  const std::string& path() const { return path_; }
  const Metadata& metadata() const { return meta_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  /// nullptr when the file has no tensor of that name.
  const TensorInfo* find(const std::string& name) const;

  /// Reads tensor `name` whole into `out` (shape.numel() floats) on every rank
  /// (collectively: each rank reads a part, then the parts are exchanged), and checks its
  /// checksum: throws CheckpointError(checksum) naming the tensor and the file on a
  /// mismatch, CheckpointError(mismatch) when `expected_shape` differs.
  void read(const std::string& name, const std::vector<std::int64_t>& expected_shape, float* out);

  /// Reads every tensor and recomputes its checksum (collective); returns the names that
  /// mismatch (empty: all intact).
  std::vector<std::string> verify_all();

  /// Statistics of the reads so far (bytes, seconds, manifest hash time).
  IoStats stats() const { return stats_; }

 private:
  /// Reads `info` whole into `out` on every rank (pieces per rank, then exchanged) and
  /// returns the checksum of what was read.
  std::uint64_t read_and_hash(const TensorInfo& info, float* out);

  MPI_Comm comm_;
  std::string path_;
  double timeout_s_;
  long long file_ = -1;  ///< hid_t
  Metadata meta_;
  std::vector<TensorInfo> tensors_;
  IoStats stats_;
  bool all_collective_ = true;  ///< every tensor read so far was collective
};

}  // namespace dst::ckpt
