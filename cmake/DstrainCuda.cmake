# Optional NVIDIA back end. Off by default; when on, every piece it needs is found here
# or configuration stops with a message naming what is missing.
#
#   DSTRAIN_ENABLE_CUDA  CUDA toolkit (nvcc, cudart), cuBLAS, cuBLASLt
#   DSTRAIN_ENABLE_NCCL  NCCL (nccl.h, libnccl); searched under DSTRAIN_NCCL_ROOT if given
#                        (only there), else NCCL_ROOT / the CUDA toolkit / system paths
set(DSTRAIN_CUDA_ARCHITECTURES "90" CACHE STRING "CUDA architectures for the CUDA back end (sm_90 = H100/H200)")
set(DSTRAIN_NCCL_ROOT "" CACHE PATH "Search NCCL only under this prefix")

set(DSTRAIN_HAVE_CUDA OFF)
set(DSTRAIN_HAVE_NCCL OFF)

if(DSTRAIN_ENABLE_NCCL AND NOT DSTRAIN_ENABLE_CUDA)
  message(FATAL_ERROR "dstrain: DSTRAIN_ENABLE_NCCL=ON needs DSTRAIN_ENABLE_CUDA=ON (NCCL runs on CUDA devices).")
endif()

if(DSTRAIN_ENABLE_CUDA)
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    message(FATAL_ERROR "dstrain: DSTRAIN_ENABLE_CUDA=ON but no CUDA compiler (nvcc) was found. "
                        "Install the CUDA toolkit (12.x or 13.x) or set CMAKE_CUDA_COMPILER.")
  endif()
  if(NOT CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES ${DSTRAIN_CUDA_ARCHITECTURES})
  endif()
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  foreach(_lib cudart_static cublas cublasLt)
    if(NOT TARGET CUDA::${_lib})
      message(FATAL_ERROR "dstrain: DSTRAIN_ENABLE_CUDA=ON but CUDA::${_lib} was not found in the "
                          "CUDA toolkit at '${CUDAToolkit_LIBRARY_DIR}'.")
    endif()
  endforeach()
  set(DSTRAIN_HAVE_CUDA ON)
  message(STATUS "dstrain: CUDA back end enabled (CUDA ${CUDAToolkit_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES})")
endif()

if(DSTRAIN_ENABLE_NCCL)
  if(DSTRAIN_NCCL_ROOT)
    set(_nccl_search PATHS ${DSTRAIN_NCCL_ROOT} NO_DEFAULT_PATH)
  else()
    set(_nccl_search HINTS $ENV{NCCL_ROOT} $ENV{NCCL_HOME} ${CUDAToolkit_LIBRARY_ROOT} ${CUDAToolkit_TARGET_DIR})
  endif()
  find_path(DSTRAIN_NCCL_INCLUDE_DIR nccl.h ${_nccl_search} PATH_SUFFIXES include NO_CACHE)
  find_library(DSTRAIN_NCCL_LIBRARY nccl ${_nccl_search} PATH_SUFFIXES lib lib64 NO_CACHE)
  if(NOT DSTRAIN_NCCL_INCLUDE_DIR OR NOT DSTRAIN_NCCL_LIBRARY)
    message(FATAL_ERROR "dstrain: DSTRAIN_ENABLE_NCCL=ON but NCCL was not found "
                        "(nccl.h: '${DSTRAIN_NCCL_INCLUDE_DIR}', libnccl: '${DSTRAIN_NCCL_LIBRARY}'). "
                        "Install NCCL 2.x or set DSTRAIN_NCCL_ROOT / NCCL_ROOT to its prefix.")
  endif()
  add_library(dstrain_nccl INTERFACE)
  target_include_directories(dstrain_nccl INTERFACE ${DSTRAIN_NCCL_INCLUDE_DIR})
  target_link_libraries(dstrain_nccl INTERFACE ${DSTRAIN_NCCL_LIBRARY})
  set(DSTRAIN_HAVE_NCCL ON)
  message(STATUS "dstrain: NCCL communicator enabled (${DSTRAIN_NCCL_LIBRARY})")
endif()
