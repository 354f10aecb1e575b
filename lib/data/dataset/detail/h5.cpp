/// \file h5.cpp
/// HDF5 error handling and handles for the dataset layer.
#include "data/dataset/detail/h5.hpp"

#include <sstream>

#include "data/dataset/dataset_error.hpp"
#include "data/dataset/hdf5_lock.hpp"

namespace dst::data {

namespace {
std::recursive_mutex& hdf5_mutex() {
  static std::recursive_mutex m;
  return m;
}
}  // namespace

Hdf5Lock::Hdf5Lock() : lock_(hdf5_mutex()) {
  // Failure here leaves printing on, which only makes errors noisier: not worth a throw.
  if (H5Eget_auto2(H5E_DEFAULT, &saved_func_, &saved_data_) < 0) saved_func_ = nullptr;
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

Hdf5Lock::~Hdf5Lock() {
  H5Eset_auto2(H5E_DEFAULT, saved_func_, saved_data_);
}

namespace detail {

namespace {

// Collects the innermost entry of HDF5's error stack: where the failure was detected,
// which says most ("file signature not found", "can't open object").
herr_t innermost_error(unsigned n, const H5E_error2_t* err, void* out) {
  if (n != 0) return 0;
  auto& text = *static_cast<std::string*>(out);
  char minor[256] = {0};
  if (H5Eget_msg(err->min_num, nullptr, minor, sizeof minor) < 0) minor[0] = '\0';
  text = minor;
  if (err->desc != nullptr && err->desc[0] != '\0') text += std::string(" (") + err->desc + ")";
  return 0;
}

}  // namespace

std::string h5_error_message(const char* call, const std::string& where, const char* file,
                             int line) {
  std::string detail;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, innermost_error, &detail);
  H5Eclear2(H5E_DEFAULT);
  std::ostringstream os;
  os << where << ": HDF5 call failed: " << call;
  if (!detail.empty()) os << ": " << detail;
  os << " [" << file << ":" << line << "]";
  return os.str();
}

void throw_h5_error(const char* call, const std::string& where, const char* file, int line) {
  throw DatasetError(h5_error_message(call, where, file, line));
}

H5Handle& H5Handle::operator=(H5Handle&& o) noexcept {
  if (this != &o) {
    reset();
    id_ = o.id_;
    o.id_ = H5I_INVALID_HID;
  }
  return *this;
}

namespace {
herr_t close_id(hid_t id) {
  switch (H5Iget_type(id)) {
    case H5I_FILE:
      return H5Fclose(id);
    case H5I_DATASET:
      return H5Dclose(id);
    case H5I_DATASPACE:
      return H5Sclose(id);
    case H5I_ATTR:
      return H5Aclose(id);
    case H5I_DATATYPE:
      return H5Tclose(id);
    case H5I_GENPROP_LST:
      return H5Pclose(id);
    case H5I_GROUP:
      return H5Gclose(id);
    default:
      return H5Idec_ref(id);
  }
}
}  // namespace

void H5Handle::reset() noexcept {
  if (id_ >= 0) {
    if (close_id(id_) < 0) H5Eclear2(H5E_DEFAULT);
    id_ = H5I_INVALID_HID;
  }
}

void H5Handle::close_checked(const std::string& where) {
  if (id_ < 0) return;
  const hid_t id = id_;
  id_ = H5I_INVALID_HID;
  DST_H5_CHECK(close_id(id), where);
}

}  // namespace detail
}  // namespace dst::data
