/// \file files.cpp
/// POSIX file steps of the commit protocol.
#include "ckpt/detail/files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "ckpt/checkpoint.hpp"

namespace dst::ckpt::detail {

namespace {

[[noreturn]] void throw_errno(const std::string& what, const std::string& path, int err) {
  throw CheckpointError(CheckpointError::Kind::io,
                        what + " " + path + " failed: " + std::strerror(err));
}

// Closes a descriptor on scope exit (errors of close on a read-only or already-fsynced
// descriptor carry nothing we act on).
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  /// close(2) checked: for files just written, where close may report a write error.
  int release_and_close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

}  // namespace

void fsync_file(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) throw_errno("checkpoint: open for fsync of", path, errno);
  if (::fsync(fd.get()) != 0) throw_errno("checkpoint: fsync of", path, errno);
}

void fsync_dir(const std::string& dir) {
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) throw_errno("checkpoint: open of directory", dir, errno);
  // Some file systems (e.g. some FUSE mounts) refuse fsync on a directory with EINVAL:
  // there is nothing more we can do there, and the rename is as durable as it gets.
  if (::fsync(fd.get()) != 0 && errno != EINVAL)
    throw_errno("checkpoint: fsync of directory", dir, errno);
}

void write_file_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (fd.get() < 0) throw_errno("checkpoint: create", tmp, errno);
    std::size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::write(fd.get(), text.data() + done, text.size() - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        throw_errno("checkpoint: write", tmp, errno);
      }
      done += static_cast<std::size_t>(n);
    }
    if (::fsync(fd.get()) != 0) throw_errno("checkpoint: fsync of", tmp, errno);
    if (fd.release_and_close() != 0) throw_errno("checkpoint: close of", tmp, errno);
  }
  rename_file(tmp, path);
  fsync_dir(parent_dir(path));
}

void rename_file(const std::string& from, const std::string& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0)
    throw_errno("checkpoint: rename to " + to + " of", from, errno);
}

std::uint64_t file_size(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT)
      throw CheckpointError(CheckpointError::Kind::missing,
                            "checkpoint " + path + " does not exist");
    throw_errno("checkpoint: stat of", path, err);
  }
  return static_cast<std::uint64_t>(st.st_size);
}

std::string checkpoint_name(std::int64_t step) {
  return "step-" + std::to_string(step) + ".h5";
}

std::optional<std::int64_t> parse_checkpoint_name(const std::string& name) {
  constexpr std::string_view prefix = "step-", suffix = ".h5";
  if (name.size() <= prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return std::nullopt;
  const std::string digits =
      name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  // Unpadded decimal only: "step-007.h5" is not ours, and 19 digits keep it in int64.
  if (digits.size() > 18 || (digits.size() > 1 && digits[0] == '0')) return std::nullopt;
  std::int64_t step = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    step = step * 10 + (c - '0');
  }
  return step;
}

std::string parent_dir(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string base_name(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace dst::ckpt::detail
