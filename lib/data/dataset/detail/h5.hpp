#pragma once
/// \file h5.hpp
/// Internals shared by the dataset sources: the HDF5 checking macro, an owning handle
/// and typed attribute access. Every function here expects the caller to hold Hdf5Lock.

#include <hdf5.h>

#include <cstdint>
#include <string>

namespace dst::data::detail {

/// "<where>: HDF5 call failed: <call>: <HDF5's innermost error> [file:line]", and clears
/// HDF5's error stack. The text of every HDF5 failure (the checkpoint layer's too).
std::string h5_error_message(const char* call, const std::string& where, const char* file,
                             int line);

/// Throws DatasetError(h5_error_message(...)).
[[noreturn]] void throw_h5_error(const char* call, const std::string& where, const char* file,
                                 int line);

/// Returns `rc` unless it is negative (HDF5's failure value for herr_t, hid_t, htri_t,
/// hssize_t), in which case it throws through throw_h5_error.
template <class T>
T h5_check(T rc, const char* call, const std::string& where, const char* file, int line) {
  if (rc < 0) throw_h5_error(call, where, file, line);
  return rc;
}

/// An owning HDF5 identifier (file, dataset, dataspace, attribute, datatype, property
/// list), closed with the matching H5?close when destroyed. Move-only.
class H5Handle {
 public:
  H5Handle() = default;
  explicit H5Handle(hid_t id) : id_(id) {}
  H5Handle(H5Handle&& o) noexcept : id_(o.id_) { o.id_ = H5I_INVALID_HID; }
  H5Handle& operator=(H5Handle&& o) noexcept;
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;
  ~H5Handle() { reset(); }

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
  /// Closes the identifier and throws if closing fails (a file's close flushes it).
  void close_checked(const std::string& where);

 private:
  hid_t id_ = H5I_INVALID_HID;
};

}  // namespace dst::data::detail

/// Checks an HDF5 call: DST_H5_CHECK(H5Dread(...), path). `where` names the file (and
/// object) the call concerns; the error adds the call text and file:line.
#define DST_H5_CHECK(call, where) \
  ::dst::data::detail::h5_check((call), #call, (where), __FILE__, __LINE__)
