#pragma once
/// \file mpi_world.hpp
/// This process's rank in MPI_COMM_WORLD and the world's size, for the MPI tests; their
/// collectives' deadline and small models; a layout of the world; and rank 0's copy of a
/// text, to check that every rank says the same.
#include <mpi.h>

#include <string>
#include <vector>

#include "config/run_config.hpp"

namespace dst::test {

/// The deadline of the MPI tests' collectives: generous, as 4 ranks share 2 cores in CI.
inline constexpr double kTestTimeoutS = 30.0;

/// Deck model sections: tiny and tiny-moe at a quarter of their width (0.23 M and 0.68 M
/// parameters), every kind of tensor at a fraction of the cost.
inline constexpr const char* kQuarterTiny = "model: {preset: tiny, d_model: 64, ffn_dim: 172}\n";
inline constexpr const char* kQuarterTinyMoe =
    "model: {preset: tiny-moe, d_model: 64, ffn_dim: 172, moe_intermediate_size: 56}\n";

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

/// The world as data x tensor x pipeline ranks (their product must be the world's size),
/// expert groups of `expert` data ranks.
inline config::Layout world_layout(int data, int tensor, int pipeline, int expert = 1) {
  config::Layout l;
  l.world_size = world_size();
  l.data = data;
  l.tensor = tensor;
  l.pipeline = pipeline;
  l.expert = expert;
  return l;
}

/// Rank 0's `text` (collective over the world): a test compares its own with it.
inline std::string rank0_text(const std::string& text) {
  std::vector<char> root(text.begin(), text.end());
  int n = static_cast<int>(root.size());
  MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
  root.resize(static_cast<std::size_t>(n));
  MPI_Bcast(root.data(), n, MPI_CHAR, 0, MPI_COMM_WORLD);
  return std::string(root.begin(), root.end());
}

}  // namespace dst::test
