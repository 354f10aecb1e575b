#pragma once
/// \file files.hpp
/// File-system steps of the commit protocol (docs/checkpoint.md, "commit"): fsync of a
/// file and of a directory, write-then-rename of small files, checkpoint file names. All
/// throw CheckpointError(io) naming the path and errno's text.

#include <cstdint>
#include <optional>
#include <string>

namespace dst::ckpt::detail {

/// Opens `path` read-only and fsyncs it: after a collective close, the data other ranks
/// wrote through MPI-IO is made durable by any process's fsync of the file.
void fsync_file(const std::string& path);
/// fsyncs the directory, making renames and unlinks in it durable.
void fsync_dir(const std::string& dir);
/// Writes `text` to `path` via path.tmp: write, fsync, rename, fsync of the directory.
void write_file_atomic(const std::string& path, const std::string& text);
/// rename(2) with an error naming both paths.
void rename_file(const std::string& from, const std::string& to);
/// Size in bytes; throws CheckpointError(missing) when the file does not exist.
std::uint64_t file_size(const std::string& path);

/// "step-12.h5".
std::string checkpoint_name(std::int64_t step);
/// The step of a name "step-<N>.h5" (N unpadded decimal, no sign), or nullopt.
std::optional<std::int64_t> parse_checkpoint_name(const std::string& name);
/// The directory part of a path ("." when there is none).
std::string parent_dir(const std::string& path);
/// The file-name part of a path.
std::string base_name(const std::string& path);

/// Now, as ISO 8601 UTC with seconds: "2025-01-31T12:00:00Z".
std::string utc_now();

}  // namespace dst::ckpt::detail
