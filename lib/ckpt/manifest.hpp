#pragma once
/// \file manifest.hpp
/// The manifest beside each committed checkpoint (docs/checkpoint.md, "manifest"): a small
/// JSON file, step-<N>.manifest.json, whose existence marks step-<N>.h5 as committed and
/// whose size and whole-file xxh64 are checked before libhdf5 ever opens the file. Plain
/// functions of one process (not collective); the checkpoint layer calls them on rank 0.

#include <cstdint>
#include <string>

namespace dst::ckpt {

/// The manifest's `format` value.
inline constexpr const char* kManifestFormat = "dstrain-checkpoint-manifest";

struct Manifest {
  int manifest_version = 0;
  int checkpoint_format_version = 0;
  std::string file;         ///< the checkpoint's file name (no directory): "step-12.h5"
  std::uint64_t size = 0;   ///< bytes
  std::uint64_t xxh64 = 0;  ///< xxh64 (seed 0) of the whole file; "%016x" in the JSON,
                            ///< as `xxhsum -H64` prints it
  std::int64_t step = 0;
  std::string created_utc;
};

/// "dir/step-12.manifest.json" for "dir/step-12.h5".
std::string manifest_path(const std::string& checkpoint_path);

/// xxh64 (seed 0) of the whole file, streamed; throws CheckpointError(io) naming the file.
std::uint64_t file_xxh64(const std::string& path);

/// Parses a manifest; throws CheckpointError(manifest) naming the file when it is
/// missing, not JSON, of another format or version, or lacks a field.
Manifest read_manifest(const std::string& manifest_file);

/// Writes `m` to `manifest_file` crash-safely: a .tmp beside it, fsync, rename, fsync of
/// the directory. Throws CheckpointError(io) naming the file.
void write_manifest(const std::string& manifest_file, const Manifest& m);

/// The manifest of `checkpoint_path` as it is on disk now (size, hash, name), with `step`
/// and `created_utc` as given: what save() writes, and what a test or a repair tool uses
/// to re-commit a file it changed on purpose.
Manifest describe_file(const std::string& checkpoint_path, std::int64_t step,
                       const std::string& created_utc);

/// "0123456789abcdef": 16 lowercase hex digits, as xxhsum prints an XXH64.
std::string hex64(std::uint64_t value);

}  // namespace dst::ckpt
