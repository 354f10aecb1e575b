#include "h5/handle.hpp"

namespace dst::h5 {

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

Handle& Handle::operator=(Handle&& o) noexcept {
  if (this != &o) {
    reset();
    id_ = o.id_;
    o.id_ = H5I_INVALID_HID;
  }
  return *this;
}

void Handle::reset() noexcept {
  if (id_ >= 0) {
    if (close_id(id_) < 0) H5Eclear2(H5E_DEFAULT);
    id_ = H5I_INVALID_HID;
  }
}

void Handle::close_checked(const std::string& where, Raise raise) {
  if (id_ < 0) return;
  const hid_t id = id_;
  id_ = H5I_INVALID_HID;
  DST_H5_CHECK_WITH(raise, close_id(id), where);
}

}  // namespace dst::h5
