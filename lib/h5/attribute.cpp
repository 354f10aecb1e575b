#include "h5/attribute.hpp"

#include <vector>

namespace dst::h5 {

void write_scalar_attribute(hid_t obj, const char* name, hid_t file_type, hid_t mem_type,
                            const void* value, const std::string& where, Raise raise) {
  const std::string what = where + " attribute " + name;
  Handle space(DST_H5_CHECK_WITH(raise, H5Screate(H5S_SCALAR), what));
  Handle attr(DST_H5_CHECK_WITH(
      raise, H5Acreate2(obj, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT), what));
  DST_H5_CHECK_WITH(raise, H5Awrite(attr.get(), mem_type, value), what);
}

void write_fixed_string_attribute(hid_t obj, const char* name, const std::string& value,
                                  const std::string& where, Raise raise) {
  Handle type(DST_H5_CHECK_WITH(raise, H5Tcopy(H5T_C_S1), where));
  const std::string padded = value.empty() ? std::string(1, '\0') : value;
  DST_H5_CHECK_WITH(raise, H5Tset_size(type.get(), padded.size()), where);
  DST_H5_CHECK_WITH(raise, H5Tset_strpad(type.get(), H5T_STR_NULLPAD), where);
  write_scalar_attribute(obj, name, type.get(), type.get(), padded.data(), where, raise);
}

void write_variable_string_attribute(hid_t obj, const char* name, const std::string& value,
                                     const std::string& where, Raise raise) {
  Handle type(DST_H5_CHECK_WITH(raise, H5Tcopy(H5T_C_S1), where));
  DST_H5_CHECK_WITH(raise, H5Tset_size(type.get(), H5T_VARIABLE), where);
  DST_H5_CHECK_WITH(raise, H5Tset_cset(type.get(), H5T_CSET_UTF8), where);
  const char* text = value.c_str();
  write_scalar_attribute(obj, name, type.get(), type.get(), &text, where, raise);
}

bool has_attribute(hid_t obj, const char* name, const std::string& where, Raise raise) {
  return DST_H5_CHECK_WITH(raise, H5Aexists(obj, name), where) > 0;
}

Handle open_attribute(hid_t obj, const char* name, hssize_t& points, const std::string& where,
                      Raise raise) {
  const std::string what = where + " attribute " + name;
  Handle attr(DST_H5_CHECK_WITH(raise, H5Aopen(obj, name, H5P_DEFAULT), what));
  Handle space(DST_H5_CHECK_WITH(raise, H5Aget_space(attr.get()), what));
  points = DST_H5_CHECK_WITH(raise, H5Sget_simple_extent_npoints(space.get()), what);
  return attr;
}

std::string read_string_attribute(hid_t attr, hid_t type, std::size_t max_bytes, bool& too_long,
                                  const std::string& where, Raise raise) {
  too_long = false;
  Handle mem(DST_H5_CHECK_WITH(raise, H5Tcopy(H5T_C_S1), where));
  DST_H5_CHECK_WITH(
      raise, H5Tset_cset(mem.get(), DST_H5_CHECK_WITH(raise, H5Tget_cset(type), where)), where);
  std::string value;
  if (DST_H5_CHECK_WITH(raise, H5Tis_variable_str(type), where) > 0) {
    DST_H5_CHECK_WITH(raise, H5Tset_size(mem.get(), H5T_VARIABLE), where);
    char* text = nullptr;
    DST_H5_CHECK_WITH(raise, H5Aread(attr, mem.get(), &text), where);
    if (text != nullptr) {
      value = text;
      H5free_memory(text);
    }
    return value;
  }
  const std::size_t size = H5Tget_size(type);
  if (size == 0 || size > max_bytes) {
    too_long = true;
    return value;
  }
  DST_H5_CHECK_WITH(raise, H5Tset_size(mem.get(), size + 1), where);  // + 1: room for the NUL
  std::vector<char> buf(size + 1, '\0');
  DST_H5_CHECK_WITH(raise, H5Aread(attr, mem.get(), buf.data()), where);
  return std::string(buf.data());  // up to the first NUL (NUL padding or termination)
}

}  // namespace dst::h5
