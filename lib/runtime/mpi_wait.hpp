#pragma once
/// \file mpi_wait.hpp
/// Waiting for a non-blocking MPI operation against a deadline. Open MPI makes no
/// asynchronous progress, so this polls MPI_Test under core::PollPolicy::collective().

#include <mpi.h>

#include <functional>
#include <string>

namespace dst::runtime {

/// Waits for `request` (MPI_Test until complete). If `timeout_s` (> 0) passes first,
/// throws dst::TimeoutError with "<describe()> did not complete within T s at <step>
/// (rank R waited; a peer is missing, hung or slower than the deadline)". The request
/// is left pending in that case (the job is about to be aborted).
void wait_with_deadline(MPI_Request& request, double timeout_s,
                        const std::function<std::string()>& describe);

/// One poll of `request`; true when complete.
bool test_request(MPI_Request& request);

}  // namespace dst::runtime
