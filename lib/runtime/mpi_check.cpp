#include "runtime/mpi_check.hpp"

#include <sstream>

#include "core/error.hpp"

namespace dst::runtime {

bool mpi_is_up() {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

namespace detail {

void throw_mpi_error(int code, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
  std::ostringstream os;
  os << "MPI call failed: " << call << ": " << std::string(text, static_cast<std::size_t>(len))
     << " (code " << code << ") [" << file << ":" << line << "]";
  throw Error(os.str());
}

}  // namespace detail

}  // namespace dst::runtime
