#pragma once
/// \file attribute.hpp
/// Scalar attributes, the HDF5 plumbing every format of ours shares (dataset shards,
/// checkpoints): creating and writing one, and reading a string whatever its storage. Each
/// layer keeps its own rules (which types it accepts, what a missing attribute means) and
/// its own error type, given as `raise` for failed HDF5 calls. The caller holds h5::Lock.

#include <hdf5.h>

#include <cstddef>
#include <string>

#include "h5/check.hpp"
#include "h5/handle.hpp"

namespace dst::h5 {

/// Creates the scalar attribute `name` on `obj` of `file_type` and writes *value, which
/// has `mem_type` (HDF5 converts). `where` names the file for errors.
void write_scalar_attribute(hid_t obj, const char* name, hid_t file_type, hid_t mem_type,
                            const void* value, const std::string& where, Raise raise);
/// A fixed-length, NUL-padded ASCII string attribute of value.size() bytes (one NUL for
/// an empty value: HDF5 has no 0-byte string type). h5py reads it as bytes.
void write_fixed_string_attribute(hid_t obj, const char* name, const std::string& value,
                                  const std::string& where, Raise raise);
/// A variable-length UTF-8 string attribute: h5py reads it as str, h5dump prints text.
void write_variable_string_attribute(hid_t obj, const char* name, const std::string& value,
                                     const std::string& where, Raise raise);

/// Whether `obj` has the attribute `name`.
bool has_attribute(hid_t obj, const char* name, const std::string& where, Raise raise);
/// The attribute `name` of `obj` (which must exist) and its number of values.
Handle open_attribute(hid_t obj, const char* name, hssize_t& points, const std::string& where,
                      Raise raise);

/// The value of a string attribute `attr` of file type `type` (class H5T_STRING, checked by
/// the caller): variable-length, or fixed-length up to the first NUL. A fixed-length one
/// must be at most `max_bytes` long (the caller's bound against a hostile file), else
/// `too_long` is set and "" returned without reading.
std::string read_string_attribute(hid_t attr, hid_t type, std::size_t max_bytes, bool& too_long,
                                  const std::string& where, Raise raise);

}  // namespace dst::h5
