/// \file manifest.cpp
/// The manifest beside each committed checkpoint, and the whole-file hash it records.
#include "ckpt/manifest.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "ckpt/checkpoint.hpp"
#include "ckpt/detail/files.hpp"

namespace dst::ckpt {

namespace {

struct XxhStateDeleter {
  void operator()(XXH64_state_t* s) const { XXH64_freeState(s); }
};

[[noreturn]] void bad_manifest(const std::string& file, const std::string& why) {
  throw CheckpointError(CheckpointError::Kind::manifest,
                        "checkpoint manifest " + file + ": " + why);
}

}  // namespace

std::string manifest_path(const std::string& checkpoint_path) {
  std::string base = checkpoint_path;
  if (base.size() >= 3 && base.compare(base.size() - 3, 3, ".h5") == 0)
    base.resize(base.size() - 3);
  return base + ".manifest.json";
}

std::string hex64(std::uint64_t value) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(value));
  return buf;
}

std::uint64_t file_xxh64(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw CheckpointError(
        CheckpointError::Kind::io,
        "checkpoint: open of " + path + " for hashing failed: " + std::strerror(errno));
  // The whole file is read once, front to back: tell the kernel to read ahead.
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  std::unique_ptr<XXH64_state_t, XxhStateDeleter> state(XXH64_createState());
  XXH64_reset(state.get(), 0);
  // 8 MiB reads: large enough that system-call overhead vanishes next to hashing
  // (~10 GB/s), small enough to stay in cache between read and hash.
  std::vector<char> buf(std::size_t{8} << 20);
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      throw CheckpointError(
          CheckpointError::Kind::io,
          "checkpoint: read of " + path + " for hashing failed: " + std::strerror(err));
    }
    if (n == 0) break;
    XXH64_update(state.get(), buf.data(), static_cast<std::size_t>(n));
  }
  ::close(fd);
  return XXH64_digest(state.get());
}

Manifest read_manifest(const std::string& manifest_file) {
  std::ifstream in(manifest_file);
  if (!in)
    bad_manifest(manifest_file,
                 "missing: the checkpoint was never committed (its save did not finish) or the "
                 "manifest was removed; the checkpoint is not opened without it");
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    bad_manifest(manifest_file, std::string("not valid JSON: ") + e.what());
  }
  Manifest m;
  try {
    if (j.at("format").get<std::string>() != kManifestFormat)
      bad_manifest(manifest_file, "format is \"" + j.at("format").get<std::string>() +
                                      "\", expected \"" + kManifestFormat + "\"");
    m.manifest_version = j.at("manifest_version").get<int>();
    if (m.manifest_version != kManifestVersion)
      bad_manifest(manifest_file, "manifest_version " + std::to_string(m.manifest_version) +
                                      ", this dstrain reads " + std::to_string(kManifestVersion));
    m.checkpoint_format_version = j.at("checkpoint_format_version").get<int>();
    m.file = j.at("file").get<std::string>();
    m.size = j.at("size").get<std::uint64_t>();
    const std::string hex = j.at("xxh64").get<std::string>();
    std::size_t used = 0;
    if (hex.size() != 16) bad_manifest(manifest_file, "xxh64 \"" + hex + "\" is not 16 hex digits");
    m.xxh64 = std::stoull(hex, &used, 16);
    if (used != hex.size()) bad_manifest(manifest_file, "xxh64 \"" + hex + "\" is not hex");
    m.step = j.at("step").get<std::int64_t>();
    m.created_utc = j.at("created_utc").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    bad_manifest(manifest_file, std::string("missing or mistyped field: ") + e.what());
  } catch (const std::logic_error& e) {  // std::stoull on non-hex text
    bad_manifest(manifest_file, std::string("xxh64 is not hex: ") + e.what());
  }
  return m;
}

void write_manifest(const std::string& manifest_file, const Manifest& m) {
  nlohmann::ordered_json j;
  j["format"] = kManifestFormat;
  j["manifest_version"] = m.manifest_version;
  j["checkpoint_format_version"] = m.checkpoint_format_version;
  j["file"] = m.file;
  j["size"] = m.size;
  j["xxh64"] = hex64(m.xxh64);
  j["step"] = m.step;
  j["created_utc"] = m.created_utc;
  detail::write_file_atomic(manifest_file, j.dump(2) + "\n");
}

Manifest describe_file(const std::string& checkpoint_path, std::int64_t step,
                       const std::string& created_utc) {
  Manifest m;
  m.manifest_version = kManifestVersion;
  m.checkpoint_format_version = kFormatVersion;
  m.file = detail::base_name(checkpoint_path);
  m.size = detail::file_size(checkpoint_path);
  m.xxh64 = file_xxh64(checkpoint_path);
  m.step = step;
  m.created_utc = created_utc;
  return m;
}

}  // namespace dst::ckpt
