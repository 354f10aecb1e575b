#include "h5/lock.hpp"

namespace dst::h5 {

namespace {
std::recursive_mutex& hdf5_mutex() {
  static std::recursive_mutex m;
  return m;
}
}  // namespace

Lock::Lock() : lock_(hdf5_mutex()) {
  // Failure here leaves printing on, which only makes errors noisier: not worth a throw.
  if (H5Eget_auto2(H5E_DEFAULT, &saved_func_, &saved_data_) < 0) saved_func_ = nullptr;
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

Lock::~Lock() {
  H5Eset_auto2(H5E_DEFAULT, saved_func_, saved_data_);
}

}  // namespace dst::h5
