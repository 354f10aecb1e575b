#pragma once
/// \file partition.hpp
/// Who writes, reads and hashes what (docs/checkpoint.md, "collective I/O"). Pure
/// functions of the tensor shapes and the rank count, so every rank computes every
/// rank's share without communicating.
///
/// Tensors are split by rows (the first dimension; a 0-d or 1-d tensor's rows are single
/// elements) so that each rank's share of a dataset is one hyperslab.

#include <algorithm>
#include <cstdint>
#include <vector>

namespace dst::ckpt::detail {

/// Rows [begin, end) of a tensor.
/// Elements of a tensor of `shape` (1 for a scalar). Shapes come from the caller or from a
/// file whose extents list_tensors() has checked against the stored bytes.
inline std::uint64_t numel(const std::vector<std::int64_t>& shape) {
  std::uint64_t n = 1;
  for (const auto d : shape)
    n *= static_cast<std::uint64_t>(d);
  return n;
}

struct RowRange {
  std::uint64_t begin = 0, end = 0;
  std::uint64_t rows() const { return end - begin; }
};

/// Rows of the first dimension (1 for a 0-d tensor) and elements per row.
struct RowShape {
  std::uint64_t rows = 1, row_elements = 1;
};

inline RowShape row_shape(const std::vector<std::int64_t>& shape) {
  RowShape r;
  if (shape.empty()) return r;
  r.rows = static_cast<std::uint64_t>(shape[0]);
  for (std::size_t i = 1; i < shape.size(); ++i)
    r.row_elements *= static_cast<std::uint64_t>(shape[i]);
  return r;
}

/// floor(total * part / parts), exactly and without overflow for parts < 2^31: with
/// total = q * parts + r, it is q * part + floor(r * part / parts).
inline std::uint64_t split_point(std::uint64_t total, std::uint64_t part, std::uint64_t parts) {
  return total / parts * part + total % parts * part / parts;
}

/// Writing: the concatenation of all tensors' elements (total elements) is cut into
/// `size` equal contiguous ranges; rank `rank` writes the rows of the tensor at element
/// `offset` (shape `rs`) whose first element falls in its range. Adjacent ranks' row
/// ranges meet exactly, so every row is written once; a rank's share differs from
/// total/size by less than one row per range boundary.
inline RowRange write_rows(std::uint64_t offset, RowShape rs, std::uint64_t total, int rank,
                           int size) {
  const auto first_row_at = [&](std::uint64_t boundary) -> std::uint64_t {
    if (boundary <= offset) return 0;
    if (rs.row_elements == 0) return rs.rows;  // no elements: nothing to split
    const std::uint64_t rows = (boundary - offset + rs.row_elements - 1) / rs.row_elements;
    return std::min(rows, rs.rows);
  };
  if (total == 0) return {};
  return {first_row_at(split_point(total, rank, size)),
          first_row_at(split_point(total, rank + 1, size))};
}

/// Reading one tensor: its rows cut into `size` equal ranges, one per rank.
inline RowRange read_rows(RowShape rs, int rank, int size) {
  return {split_point(rs.rows, rank, size), split_point(rs.rows, rank + 1, size)};
}

/// A rank's rows cut into pieces of at most `max_elements` elements (at least one row
/// each), so that no single HDF5 or MPI call moves more than MPI's int count allows.
inline std::vector<RowRange> pieces(RowRange r, RowShape rs, std::uint64_t max_elements) {
  std::vector<RowRange> out;
  const std::uint64_t step =
      std::max<std::uint64_t>(1, rs.row_elements == 0 ? r.rows() : max_elements / rs.row_elements);
  for (std::uint64_t b = r.begin; b < r.end; b += step)
    out.push_back({b, std::min(r.end, b + step)});
  return out;
}

/// Checksum blocks: [first, end) of a list of `blocks` blocks given to rank `rank`.
inline RowRange block_share(std::uint64_t blocks, int rank, int size) {
  return {split_point(blocks, rank, size), split_point(blocks, rank + 1, size)};
}

}  // namespace dst::ckpt::detail
