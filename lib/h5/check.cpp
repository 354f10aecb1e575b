#include "h5/check.hpp"

#include <sstream>

#include "core/error.hpp"

namespace dst::h5 {

namespace {

// Collects the innermost entry of HDF5's error stack: where the failure was detected,
// which says most ("file signature not found", "can't open object").
herr_t innermost_error(unsigned n, const H5E_error2_t* err, void* out) {
  if (n != 0) return 0;
  auto& text = *static_cast<std::string*>(out);
  char minor[256] = {0};
  if (H5Eget_msg(err->min_num, nullptr, minor, sizeof minor) < 0) minor[0] = '\0';
  text = minor;
  if (err->desc != nullptr && err->desc[0] != '\0') text += std::string(" (") + err->desc + ")";
  return 0;
}

}  // namespace

void raise_error(const std::string& message) {
  throw Error(message);
}

std::string error_message(const char* call, const std::string& where, const char* file, int line) {
  std::string detail;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, innermost_error, &detail);
  H5Eclear2(H5E_DEFAULT);
  std::ostringstream os;
  os << where << ": HDF5 call failed: " << call;
  if (!detail.empty()) os << ": " << detail;
  os << " [" << file << ":" << line << "]";
  return os.str();
}

void fail(const char* call, const std::string& where, const char* file, int line, Raise raise) {
  const std::string message = error_message(call, where, file, line);
  raise(message);
  throw Error(message);  // a Raise that returned: still no silent failure
}

}  // namespace dst::h5
