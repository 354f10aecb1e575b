# dstrain writes shards and checkpoints collectively through HDF5's MPI-IO driver, so a
# serial HDF5 cannot work; refuse it at configure time instead of failing at run time.
# Kept in its own file so a CTest script can exercise the refusal.
function(dst_require_parallel_hdf5 is_parallel include_dirs)
  if(NOT is_parallel)
    message(FATAL_ERROR
      "dstrain needs a parallel HDF5 (built with MPI, H5_HAVE_PARALLEL), but the HDF5 found "
      "(include dirs: '${include_dirs}') is serial. On Debian/Ubuntu install "
      "libhdf5-openmpi-dev; with Spack use hdf5+mpi; or point HDF5_ROOT at a parallel build.")
  endif()
endfunction()
