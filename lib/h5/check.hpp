#pragma once
/// \file check.hpp
/// Checking HDF5 calls: every call goes through DST_H5_CHECK_WITH (or a layer's macro
/// built on it), which turns a failure into the layer's own error whose message names
/// the file, the call, HDF5's innermost error and file:line. The caller holds h5::Lock.

#include <hdf5.h>

#include <string>

namespace dst::h5 {

/// Throws the error a layer reports an HDF5 failure with, carrying `message`
/// (data::DatasetError, ckpt::CheckpointError(io), dst::Error). Must not return.
using Raise = void (*)(const std::string& message);

/// Throws dst::Error(message): the default for HDF5 users without an error type of their own.
[[noreturn]] void raise_error(const std::string& message);

/// "<where>: HDF5 call failed: <call>: <HDF5's innermost error> [file:line]", and clears
/// HDF5's error stack. The text of every HDF5 failure.
std::string error_message(const char* call, const std::string& where, const char* file, int line);

/// Calls raise(error_message(...)) (and throws dst::Error with it, should raise return).
[[noreturn]] void fail(const char* call, const std::string& where, const char* file, int line,
                       Raise raise);

/// Returns `rc` unless it is negative (HDF5's failure value for herr_t, hid_t, htri_t,
/// hssize_t), in which case it fails through `raise`.
template <class T>
T check(T rc, const char* call, const std::string& where, const char* file, int line, Raise raise) {
  if (rc < 0) fail(call, where, file, line, raise);
  return rc;
}

}  // namespace dst::h5

/// Checks an HDF5 call: DST_H5_CHECK_WITH(raise, H5Dread(...), path). `where` names the
/// file (and object) the call concerns; `raise` throws the caller's error type.
#define DST_H5_CHECK_WITH(raise, call, where) \
  ::dst::h5::check((call), #call, (where), __FILE__, __LINE__, (raise))

/// DST_H5_CHECK_WITH throwing dst::Error.
#define DST_H5(call, where) DST_H5_CHECK_WITH(::dst::h5::raise_error, call, where)
