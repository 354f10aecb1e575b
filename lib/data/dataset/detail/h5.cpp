/// \file h5.cpp
/// The dataset layer's error for a failed HDF5 call.
#include "data/dataset/detail/h5.hpp"

#include "data/dataset/dataset_error.hpp"

namespace dst::data::detail {

void raise_dataset_error(const std::string& message) {
  throw DatasetError(message);
}

}  // namespace dst::data::detail
