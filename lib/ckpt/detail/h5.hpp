#pragma once
/// \file h5.hpp
/// HDF5 helpers of the checkpoint layer: a checking macro that turns a failed call into
/// CheckpointError(io) naming the file, an owning handle, typed attributes and the file
/// access list (MPI-IO driver, alignment, hints). The caller holds h5::Lock.

#include <hdf5.h>
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/checkpoint.hpp"
#include "ckpt/detail/partition.hpp"
#include "h5/check.hpp"
#include "h5/handle.hpp"

namespace dst::ckpt::detail {

/// Throws CheckpointError(io, message): the checkpoint layer's h5::Raise.
[[noreturn]] void raise_checkpoint_error(const std::string& message);

/// One piece of a collective H5Dwrite/H5Dread: selects rows [piece->begin, piece->end)
/// of a tensor of `shape` in `fspace` (all of a scalar) and returns the memory space of
/// their `piece->rows() x row_elements` elements; a rank without a piece (`piece` null)
/// selects nothing in either, and still takes part in the call.
h5::Handle select_piece(hid_t fspace, const std::vector<std::int64_t>& shape, const RowRange* piece,
                        std::uint64_t row_elements, const std::string& where);

/// A file access list for the MPI-IO driver on `comm` with `io`'s alignment and hints,
/// and collective metadata reads and writes (one rank touches the metadata and shares
/// it, instead of every rank reading the same bytes: what a parallel file system wants).
h5::Handle make_mpio_fapl(MPI_Comm comm, const IoOptions& io, const std::string& where);

/// Scalar attributes on `obj`. Readers throw CheckpointError(format) when absent.
void write_attr_i64(hid_t obj, const char* name, std::int64_t v, const std::string& where);
void write_attr_u64(hid_t obj, const char* name, std::uint64_t v, const std::string& where);
void write_attr_f64(hid_t obj, const char* name, double v, const std::string& where);
/// A fixed-length, NUL-padded ASCII string attribute (h5py reads it as bytes/str).
void write_attr_str(hid_t obj, const char* name, const std::string& v, const std::string& where);
std::int64_t read_attr_i64(hid_t obj, const char* name, const std::string& where);
std::uint64_t read_attr_u64(hid_t obj, const char* name, const std::string& where);
double read_attr_f64(hid_t obj, const char* name, const std::string& where);
std::string read_attr_str(hid_t obj, const char* name, const std::string& where);

}  // namespace dst::ckpt::detail

/// Checks an HDF5 call: a failure is CheckpointError(io) "<where>: HDF5 call failed:
/// <call>: <HDF5's innermost error> [file:line]".
#define DST_CKPT_H5(call, where) \
  DST_H5_CHECK_WITH(::dst::ckpt::detail::raise_checkpoint_error, call, where)
