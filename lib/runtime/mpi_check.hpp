#pragma once
/// \file mpi_check.hpp
/// Every MPI call goes through DST_MPI_CHECK, which turns a failure into a dst::Error
/// carrying the call text, MPI's own error string and file:line.

#include <mpi.h>

#include <string>

namespace dst::runtime {

/// True between MPI_Init and MPI_Finalize: whether MPI may be called (error paths and
/// helpers that also run without MPI ask first).
bool mpi_is_up();

namespace detail {
[[noreturn]] void throw_mpi_error(int code, const char* call, const char* file, int line);
}

}  // namespace dst::runtime

#define DST_MPI_CHECK(call)                                                            \
  do {                                                                                 \
    const int dst_mpi_rc_ = (call);                                                    \
    if (dst_mpi_rc_ != MPI_SUCCESS)                                                    \
      ::dst::runtime::detail::throw_mpi_error(dst_mpi_rc_, #call, __FILE__, __LINE__); \
  } while (0)
