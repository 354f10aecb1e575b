# Finds every external dependency and turns it into an imported target.
# Each failure names what is missing and how to get it.

set(_dst_hint "Run scripts/install-deps (Debian/Ubuntu) or load the Spack environment in spack.yaml.")

find_package(MPI 3.0 REQUIRED COMPONENTS C CXX)
find_package(Threads REQUIRED)

# --- Kokkos ------------------------------------------------------------------
find_package(Kokkos 3.4 REQUIRED)
include(DstrainKokkosFix)
dst_fix_kokkos_include_dirs()

# --- parallel HDF5 -----------------------------------------------------------
set(HDF5_PREFER_PARALLEL TRUE)
find_package(HDF5 1.10 REQUIRED COMPONENTS C)
include(DstrainHdf5Check)
dst_require_parallel_hdf5("${HDF5_IS_PARALLEL}" "${HDF5_INCLUDE_DIRS}")
# Parallel HDF5's headers include mpi.h: our target carries MPI along.
add_library(dstrain_hdf5 INTERFACE)
if(TARGET hdf5::hdf5)
  target_link_libraries(dstrain_hdf5 INTERFACE hdf5::hdf5)
else()
  target_include_directories(dstrain_hdf5 INTERFACE ${HDF5_INCLUDE_DIRS})
  target_link_libraries(dstrain_hdf5 INTERFACE ${HDF5_LIBRARIES})
  target_compile_definitions(dstrain_hdf5 INTERFACE ${HDF5_DEFINITIONS})
endif()
target_link_libraries(dstrain_hdf5 INTERFACE MPI::MPI_C)

# --- yaml-cpp ----------------------------------------------------------------
find_package(yaml-cpp 0.6 REQUIRED)
if(TARGET yaml-cpp::yaml-cpp)
  set(DSTRAIN_YAML_TARGET yaml-cpp::yaml-cpp)
else()
  set(DSTRAIN_YAML_TARGET yaml-cpp)  # yaml-cpp 0.7 exports the bare name
endif()

# --- JSON (metrics, tokenizer.json) ------------------------------------------------
find_package(nlohmann_json 3 REQUIRED)

# --- BLAS (OpenBLAS's CBLAS) --------------------------------------------------
set(BLA_VENDOR OpenBLAS)
find_package(BLAS REQUIRED)
find_path(DSTRAIN_CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas openblas-pthread)
if(NOT DSTRAIN_CBLAS_INCLUDE_DIR)
  message(FATAL_ERROR "dstrain: cblas.h (OpenBLAS) not found. ${_dst_hint}")
endif()
add_library(dstrain_blas INTERFACE)
target_include_directories(dstrain_blas SYSTEM INTERFACE ${DSTRAIN_CBLAS_INCLUDE_DIR})
target_link_libraries(dstrain_blas INTERFACE BLAS::BLAS)

# --- CUDA back end (optional) -------------------------------------------------
include(DstrainCuda)

# --- test and benchmark frameworks -------------------------------------------
if(DSTRAIN_ENABLE_TESTS)
  find_package(GTest REQUIRED)
endif()
if(DSTRAIN_ENABLE_BENCHMARKS)
  find_package(benchmark REQUIRED)
endif()
