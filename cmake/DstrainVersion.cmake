# Version information compiled into the library: project version and git hash. The hash is
# taken at every build (target dst_git_hash, cmake/DstrainGitHash.cmake), so a build
# directory configured at one commit and rebuilt at another reports the newer one.
find_package(Git QUIET)
set(DSTRAIN_GIT_HASH_HEADER "${PROJECT_BINARY_DIR}/generated/dstrain_git_hash.h")
add_custom_target(dst_git_hash
  COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${PROJECT_SOURCE_DIR} -DOUTPUT=${DSTRAIN_GIT_HASH_HEADER}
          -DGIT_EXECUTABLE=${GIT_EXECUTABLE} -P ${CMAKE_CURRENT_LIST_DIR}/DstrainGitHash.cmake
  BYPRODUCTS ${DSTRAIN_GIT_HASH_HEADER}
  COMMENT "Reading the git hash"
  VERBATIM)
set(DSTRAIN_YAML_CPP_VERSION "${yaml-cpp_VERSION}")
