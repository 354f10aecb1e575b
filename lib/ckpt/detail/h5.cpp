/// \file h5.cpp
/// HDF5 error handling, handles and attributes for the checkpoint layer.
#include "ckpt/detail/h5.hpp"

#include <cstddef>

#include "h5/attribute.hpp"
#include "runtime/mpi_check.hpp"

namespace dst::ckpt::detail {

namespace {

// The longest string attribute read (the run's deck and RNG state are far below it): a
// larger one is a damaged file, refused before any allocation.
constexpr std::size_t kMaxStringAttr = std::size_t{1} << 30;

[[noreturn]] void missing_attr(const char* name, const std::string& where) {
  throw CheckpointError(
      CheckpointError::Kind::format,
      where + ": attribute " + name + " is missing: not a dstrain checkpoint, or a damaged one");
}

/// The attribute `name` of `obj`, which must exist and hold one value.
h5::Handle open_scalar_attr(hid_t obj, const char* name, const std::string& where) {
  if (!h5::has_attribute(obj, name, where, raise_checkpoint_error)) missing_attr(name, where);
  hssize_t points = 0;
  h5::Handle attr = h5::open_attribute(obj, name, points, where, raise_checkpoint_error);
  if (points != 1)
    throw CheckpointError(CheckpointError::Kind::format,
                          where + ": attribute " + name + " is not a scalar");
  return attr;
}

void write_scalar_attr(hid_t obj, const char* name, hid_t file_type, hid_t mem_type, const void* v,
                       const std::string& where) {
  h5::write_scalar_attribute(obj, name, file_type, mem_type, v, where, raise_checkpoint_error);
}

void read_scalar_attr(hid_t obj, const char* name, hid_t mem_type, void* v,
                      const std::string& where) {
  h5::Handle attr = open_scalar_attr(obj, name, where);
  // HDF5 converts between integer and float types on read; a wrong class fails here.
  DST_CKPT_H5(H5Aread(attr.get(), mem_type, v), where + " attribute " + name);
}

}  // namespace

void raise_checkpoint_error(const std::string& message) {
  throw CheckpointError(CheckpointError::Kind::io, message);
}

h5::Handle make_mpio_fapl(MPI_Comm comm, const IoOptions& io, const std::string& where) {
  h5::Handle fapl(DST_CKPT_H5(H5Pcreate(H5P_FILE_ACCESS), where));
  MPI_Info info = MPI_INFO_NULL;
  if (!io.mpi_hints.empty()) {
    DST_MPI_CHECK(MPI_Info_create(&info));
    for (const auto& [key, value] : io.mpi_hints)
      DST_MPI_CHECK(MPI_Info_set(info, key.c_str(), value.c_str()));
  }
  // HDF5 duplicates both the communicator and the info object.
  const herr_t rc = H5Pset_fapl_mpio(fapl.get(), comm, info);
  if (info != MPI_INFO_NULL) MPI_Info_free(&info);
  DST_CKPT_H5(rc, where);
  if (io.alignment > 1)
    DST_CKPT_H5(H5Pset_alignment(fapl.get(), io.alignment, io.alignment), where);
    // The MPI-IO driver takes no file lock, but say so: a later HDF5 whose MPI-IO driver
    // did would fail on Lustre/NFS mounts without flock (docs/checkpoint.md, "file locking").
#if H5_VERSION_GE(1, 10, 7)
  DST_CKPT_H5(H5Pset_file_locking(fapl.get(), false, true), where);
#endif
  DST_CKPT_H5(H5Pset_all_coll_metadata_ops(fapl.get(), true), where);
  DST_CKPT_H5(H5Pset_coll_metadata_write(fapl.get(), true), where);
  return fapl;
}

void write_attr_i64(hid_t obj, const char* name, std::int64_t v, const std::string& where) {
  write_scalar_attr(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &v, where);
}
void write_attr_u64(hid_t obj, const char* name, std::uint64_t v, const std::string& where) {
  write_scalar_attr(obj, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &v, where);
}
void write_attr_f64(hid_t obj, const char* name, double v, const std::string& where) {
  write_scalar_attr(obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &v, where);
}

void write_attr_str(hid_t obj, const char* name, const std::string& v, const std::string& where) {
  h5::write_fixed_string_attribute(obj, name, v, where, raise_checkpoint_error);
}

std::int64_t read_attr_i64(hid_t obj, const char* name, const std::string& where) {
  std::int64_t v = 0;
  read_scalar_attr(obj, name, H5T_NATIVE_INT64, &v, where);
  return v;
}
std::uint64_t read_attr_u64(hid_t obj, const char* name, const std::string& where) {
  std::uint64_t v = 0;
  read_scalar_attr(obj, name, H5T_NATIVE_UINT64, &v, where);
  return v;
}
double read_attr_f64(hid_t obj, const char* name, const std::string& where) {
  double v = 0;
  read_scalar_attr(obj, name, H5T_NATIVE_DOUBLE, &v, where);
  return v;
}

std::string read_attr_str(hid_t obj, const char* name, const std::string& where) {
  h5::Handle attr = open_scalar_attr(obj, name, where);
  h5::Handle ftype(DST_CKPT_H5(H5Aget_type(attr.get()), where + " attribute " + name));
  if (H5Tget_class(ftype.get()) != H5T_STRING || H5Tis_variable_str(ftype.get()) > 0)
    throw CheckpointError(CheckpointError::Kind::format,
                          where + ": attribute " + name + " is not a fixed-length string");
  bool too_long = false;
  std::string s = h5::read_string_attribute(attr.get(), ftype.get(), kMaxStringAttr, too_long,
                                            where + " attribute " + name, raise_checkpoint_error);
  if (too_long)
    throw CheckpointError(CheckpointError::Kind::format,
                          where + ": attribute " + name + " has an implausible length");
  return s;
}

h5::Handle select_piece(hid_t fspace, const std::vector<std::int64_t>& shape, const RowRange* piece,
                        std::uint64_t row_elements, const std::string& where) {
  const hsize_t count = piece != nullptr ? piece->rows() * row_elements : 1;
  h5::Handle mspace(DST_CKPT_H5(H5Screate_simple(1, &count, nullptr), where));
  if (piece == nullptr) {
    DST_CKPT_H5(H5Sselect_none(mspace.get()), where);
    DST_CKPT_H5(H5Sselect_none(fspace), where);
  } else if (shape.empty()) {
    DST_CKPT_H5(H5Sselect_all(fspace), where);
  } else {
    std::vector<hsize_t> start(shape.size(), 0), block(shape.begin(), shape.end());
    start[0] = piece->begin;
    block[0] = piece->rows();
    DST_CKPT_H5(
        H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start.data(), nullptr, block.data(), nullptr),
        where);
  }
  return mspace;
}

}  // namespace dst::ckpt::detail
