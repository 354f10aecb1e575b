#pragma once
/// \file version.hpp
/// What this binary is: version, git revision, and the versions of the libraries it was
/// built against (the runtime ones are added by runtime::version_report()).

#include <string>

namespace dst::core {

std::string version();           ///< "0.1.0"
std::string git_hash();          ///< short hash, "-dirty" if built from a modified tree
std::string yaml_cpp_version();  ///< yaml-cpp version from the build configuration
bool built_with_cuda();
bool built_with_nccl();

}  // namespace dst::core
