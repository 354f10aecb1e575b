#pragma once
/// \file h5_generator.hpp
/// What the HDF5-writing fuzz generators (fuzz_shard, fuzz_checkpoint) share: an owning
/// identifier closed at scope exit, and giving up on inputs whose choices libhdf5 itself
/// refuses to write (not a finding: the generator could not make that file).

#include <hdf5.h>

namespace dst::fuzz {

/// Closes an identifier the generator made (of whatever kind) at scope exit.
struct Id {
  hid_t id = H5I_INVALID_HID;
  explicit Id(hid_t i) : id(i) {}
  ~Id() {
    if (id < 0) return;
    switch (H5Iget_type(id)) {
      case H5I_FILE:
        H5Fclose(id);
        break;
      case H5I_GROUP:
        H5Gclose(id);
        break;
      case H5I_DATASET:
        H5Dclose(id);
        break;
      case H5I_DATASPACE:
        H5Sclose(id);
        break;
      case H5I_ATTR:
        H5Aclose(id);
        break;
      case H5I_DATATYPE:
        H5Tclose(id);
        break;
      case H5I_GENPROP_LST:
        H5Pclose(id);
        break;
      default:
        break;
    }
  }
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  bool ok() const { return id >= 0; }
};

// The generator gives up on an input whose choices HDF5 itself refuses to write.
struct GiveUp {};
hid_t need(hid_t id) {
  if (id < 0) throw GiveUp{};
  return id;
}
void need_ok(herr_t rc) {
  if (rc < 0) throw GiveUp{};
}

}  // namespace dst::fuzz
