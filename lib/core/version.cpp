#include "core/version.hpp"

#include "dstrain_git_hash.h"  // generated at build time: DSTRAIN_GIT_HASH

namespace dst::core {

std::string version() {
  return DSTRAIN_VERSION;
}
std::string git_hash() {
  return DSTRAIN_GIT_HASH;
}
std::string yaml_cpp_version() {
  return DSTRAIN_YAML_CPP_VERSION;
}
bool built_with_cuda() {
  return DSTRAIN_HAVE_CUDA != 0;
}
bool built_with_nccl() {
  return DSTRAIN_HAVE_NCCL != 0;
}

}  // namespace dst::core
