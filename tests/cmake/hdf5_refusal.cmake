# cmake -P script: calls the configure-time HDF5 check as it runs against a serial HDF5.
include(${SOURCE_DIR}/cmake/DstrainHdf5Check.cmake)
dst_require_parallel_hdf5(FALSE "/usr/include/hdf5/serial")
