/// \file h5.cpp
/// HDF5 error handling, handles and attributes for the checkpoint layer.
#include "ckpt/detail/h5.hpp"

#include <sstream>
#include <vector>

#include "runtime/mpi_check.hpp"

namespace dst::ckpt::detail {

namespace {

[[noreturn]] void missing_attr(const char* name, const std::string& where) {
  throw CheckpointError(
      CheckpointError::Kind::format,
      where + ": attribute " + name + " is missing: not a dstrain checkpoint, or a damaged one");
}

void write_scalar_attr(hid_t obj, const char* name, hid_t file_type, hid_t mem_type, const void* v,
                       const std::string& where) {
  h5::Handle space(DST_CKPT_H5(H5Screate(H5S_SCALAR), where));
  h5::Handle attr(
      DST_CKPT_H5(H5Acreate2(obj, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                  where + " attribute " + name));
  DST_CKPT_H5(H5Awrite(attr.get(), mem_type, v), where + " attribute " + name);
}

void read_scalar_attr(hid_t obj, const char* name, hid_t mem_type, void* v,
                      const std::string& where) {
  if (DST_CKPT_H5(H5Aexists(obj, name), where) == 0) missing_attr(name, where);
  h5::Handle attr(DST_CKPT_H5(H5Aopen(obj, name, H5P_DEFAULT), where + " attribute " + name));
  h5::Handle space(DST_CKPT_H5(H5Aget_space(attr.get()), where + " attribute " + name));
  if (DST_CKPT_H5(H5Sget_simple_extent_npoints(space.get()), where) != 1)
    throw CheckpointError(CheckpointError::Kind::format,
                          where + ": attribute " + name + " is not a scalar");
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
  h5::Handle type(DST_CKPT_H5(H5Tcopy(H5T_C_S1), where));
  // HDF5 rejects 0-byte string types; an empty string is one NUL of padding.
  DST_CKPT_H5(H5Tset_size(type.get(), v.empty() ? 1 : v.size()), where);
  DST_CKPT_H5(H5Tset_strpad(type.get(), H5T_STR_NULLPAD), where);
  const std::string padded = v.empty() ? std::string(1, '\0') : v;
  write_scalar_attr(obj, name, type.get(), type.get(), padded.data(), where);
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
  if (DST_CKPT_H5(H5Aexists(obj, name), where) == 0) missing_attr(name, where);
  h5::Handle attr(DST_CKPT_H5(H5Aopen(obj, name, H5P_DEFAULT), where + " attribute " + name));
  h5::Handle ftype(DST_CKPT_H5(H5Aget_type(attr.get()), where + " attribute " + name));
  if (H5Tget_class(ftype.get()) != H5T_STRING || H5Tis_variable_str(ftype.get()) > 0)
    throw CheckpointError(CheckpointError::Kind::format,
                          where + ": attribute " + name + " is not a fixed-length string");
  const std::size_t n = H5Tget_size(ftype.get());
  h5::Handle mtype(DST_CKPT_H5(H5Tcopy(H5T_C_S1), where));
  DST_CKPT_H5(H5Tset_size(mtype.get(), n), where);
  DST_CKPT_H5(H5Tset_strpad(mtype.get(), H5T_STR_NULLPAD), where);
  std::vector<char> buf(n);
  DST_CKPT_H5(H5Aread(attr.get(), mtype.get(), buf.data()), where + " attribute " + name);
  std::string s(buf.data(), n);
  const auto end = s.find('\0');
  if (end != std::string::npos) s.resize(end);
  return s;
}

}  // namespace dst::ckpt::detail
