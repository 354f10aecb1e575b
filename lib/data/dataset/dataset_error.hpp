#pragma once
/// \file dataset_error.hpp
/// The error of the dataset layer: a shard that is missing, malformed or inconsistent, or
/// an HDF5 call that failed. The message names the file and the problem.

#include "core/error.hpp"

namespace dst::data {

/// A dataset or shard problem; the message starts with the file it concerns.
class DatasetError : public Error {
 public:
  using Error::Error;
};

}  // namespace dst::data
