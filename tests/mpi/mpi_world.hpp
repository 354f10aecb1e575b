#pragma once
/// \file mpi_world.hpp
/// This process's rank in MPI_COMM_WORLD and the world's size, for the MPI tests.
#include <mpi.h>

namespace dst::test {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

inline int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

}  // namespace dst::test
