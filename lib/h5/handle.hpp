#pragma once
/// \file handle.hpp
/// An owning HDF5 identifier. The caller holds h5::Lock.

#include <hdf5.h>

#include <string>

#include "h5/check.hpp"

namespace dst::h5 {

/// An owning HDF5 identifier (file, dataset, dataspace, attribute, datatype, property
/// list, group), closed with the matching H5?close when destroyed. Move-only.
class Handle {
 public:
  Handle() = default;
  explicit Handle(hid_t id) : id_(id) {}
  Handle(Handle&& o) noexcept : id_(o.id_) { o.id_ = H5I_INVALID_HID; }
  Handle& operator=(Handle&& o) noexcept;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  /// Gives up ownership.
  hid_t release() {
    const hid_t id = id_;
    id_ = H5I_INVALID_HID;
    return id;
  }
  /// Closes the identifier, ignoring errors (destructors and error paths).
  void reset() noexcept;
  /// Closes the identifier; a failure (a file's close flushes it) fails through `raise`
  /// naming `where`.
  void close_checked(const std::string& where, Raise raise);

 private:
  hid_t id_ = H5I_INVALID_HID;
};

}  // namespace dst::h5
