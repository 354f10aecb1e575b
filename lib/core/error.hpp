#pragma once
/// \file error.hpp
/// Library errors. Library code throws; only the application layer catches, prints
/// `[rank R] error: ...` and ends the job (see runtime/abort.hpp).

#include <sstream>
#include <stdexcept>
#include <string>

namespace dst {

/// Base of every error dstrain throws. The message names what was being done and the
/// offending value.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

/// Bad command-line usage (unknown flag, missing argument).
class UsageError : public Error {
 public:
  using Error::Error;
};

/// An invalid run deck or override. `key` is the dotted key path ("training.max_steps"),
/// `where` the location ("deck.yaml:12:5" or "--set training.max_steps=abc").
class DeckError : public Error {
 public:
  DeckError(std::string key, std::string where, const std::string& message);
  const std::string& key() const { return key_; }
  const std::string& where() const { return where_; }

 private:
  std::string key_;
  std::string where_;
};

/// A failure every rank of a collective step detected alike and throws with the same
/// message (a deck error found everywhere, non-finite gradients after the all-reduce,
/// diverged parameters). The application prints it once (rank 0) and every rank exits
/// with exit_code(), without aborting MPI.
class CollectiveError : public Error {
 public:
  CollectiveError(const std::string& what, int exit_code) : Error(what), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

/// A deadline passed: a collective or a start-up step did not complete in time.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

}  // namespace dst

/// Throws dst::Error with file:line when `cond` is false. `msg` is streamed:
/// DST_REQUIRE(n > 0, "tensor size must be positive, got " << n).
#define DST_REQUIRE(cond, msg)                                              \
  do {                                                                      \
    if (!(cond)) {                                                          \
      std::ostringstream dst_require_os_;                                   \
      dst_require_os_ << msg << " [" << __FILE__ << ":" << __LINE__ << "]"; \
      throw ::dst::Error(dst_require_os_.str());                            \
    }                                                                       \
  } while (0)
