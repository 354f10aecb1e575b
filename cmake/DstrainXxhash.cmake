# xxHash (Debian libxxhash-dev, Spack xxhash): the checkpoint checksums (docs/checkpoint.md).
# Found with find_path/find_library: neither Debian nor Spack ships a CMake package file.
find_path(DSTRAIN_XXHASH_INCLUDE_DIR xxhash.h)
find_library(DSTRAIN_XXHASH_LIBRARY xxhash)
if(NOT DSTRAIN_XXHASH_INCLUDE_DIR OR NOT DSTRAIN_XXHASH_LIBRARY)
  message(FATAL_ERROR "dstrain: xxHash not found (xxhash.h: ${DSTRAIN_XXHASH_INCLUDE_DIR}, "
    "libxxhash: ${DSTRAIN_XXHASH_LIBRARY}). Install libxxhash-dev (Debian/Ubuntu) or "
    "`spack install xxhash`, or set CMAKE_PREFIX_PATH to its prefix.")
endif()
if(NOT TARGET dstrain_xxhash)
  add_library(dstrain_xxhash INTERFACE)
  target_include_directories(dstrain_xxhash INTERFACE ${DSTRAIN_XXHASH_INCLUDE_DIR})
  target_link_libraries(dstrain_xxhash INTERFACE ${DSTRAIN_XXHASH_LIBRARY})
endif()
