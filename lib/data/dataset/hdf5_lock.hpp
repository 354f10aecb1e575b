#pragma once
/// \file hdf5_lock.hpp
/// Debian's parallel HDF5 (libhdf5-openmpi) is built without its thread-safety option:
/// two threads inside the library at once corrupt its global state. The dataset layer
/// therefore makes every HDF5 call while holding Hdf5Lock, and so must every other user
/// of HDF5 in a process that runs a prefetching BatchReader (its thread reads while the
/// main thread trains, e.g. while a checkpoint is written).

#include <hdf5.h>

#include <mutex>

namespace dst::data {

/// Holds the process-wide HDF5 mutex (recursive: nested holders on one thread are fine)
/// and, while held, turns off HDF5's automatic printing of error stacks: failures become
/// dst::data::DatasetError messages instead (DST_H5_CHECK), so a hostile file produces
/// one readable line, not a page of stack dump. The previous printing setting is restored
/// on release.
class Hdf5Lock {
 public:
  Hdf5Lock();
  ~Hdf5Lock();
  Hdf5Lock(const Hdf5Lock&) = delete;
  Hdf5Lock& operator=(const Hdf5Lock&) = delete;

 private:
  std::unique_lock<std::recursive_mutex> lock_;
  H5E_auto2_t saved_func_ = nullptr;
  void* saved_data_ = nullptr;
};

}  // namespace dst::data
