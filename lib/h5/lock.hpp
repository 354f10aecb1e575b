#pragma once
/// \file lock.hpp
/// Debian's parallel HDF5 (libhdf5-openmpi) is built without its thread-safety option:
/// two threads inside the library at once corrupt its global state. Every HDF5 call in
/// dstrain (datasets, checkpoints, parameter dumps) is therefore made while holding
/// h5::Lock, because a prefetching data::BatchReader reads on its own thread while the
/// main thread trains (e.g. while a checkpoint is written).

#include <hdf5.h>

#include <mutex>

namespace dst::h5 {

/// Holds the process-wide HDF5 mutex (recursive: nested holders on one thread are fine)
/// and, while held, turns off HDF5's automatic printing of error stacks: failures become
/// dstrain errors instead (DST_H5_CHECK_WITH, check.hpp), so a hostile file produces one
/// readable line, not a page of stack dump. The previous printing setting is restored on
/// release.
class Lock {
 public:
  Lock();
  ~Lock();
  Lock(const Lock&) = delete;
  Lock& operator=(const Lock&) = delete;

 private:
  std::unique_lock<std::recursive_mutex> lock_;
  H5E_auto2_t saved_func_ = nullptr;
  void* saved_data_ = nullptr;
};

}  // namespace dst::h5
