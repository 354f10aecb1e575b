#pragma once
/// \file h5.hpp
/// The dataset layer's HDF5 check: DST_H5_CHECK reports a failed call as DatasetError
/// (h5/check.hpp). Every function here expects the caller to hold h5::Lock.

#include <string>

#include "h5/check.hpp"

namespace dst::data::detail {

/// Throws DatasetError(message): the dataset layer's h5::Raise.
[[noreturn]] void raise_dataset_error(const std::string& message);

}  // namespace dst::data::detail

/// Checks an HDF5 call: DST_H5_CHECK(H5Dread(...), path) throws DatasetError naming
/// `where`, the call text and file:line.
#define DST_H5_CHECK(call, where) \
  DST_H5_CHECK_WITH(::dst::data::detail::raise_dataset_error, call, where)
