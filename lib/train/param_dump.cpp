#include "train/param_dump.hpp"

#include <hdf5.h>

#include <cstdio>
#include <vector>

#include "core/error.hpp"
#include "tensor/memory.hpp"

namespace dst::train {

namespace {
void check(bool ok, const std::string& what, const std::string& path) {
  if (!ok) throw Error("parameter dump '" + path + "': " + what + " failed");
}
}  // namespace

void write_parameters_h5(const std::string& path, const model::ParamStore& store,
                         std::int64_t step) {
  const std::string tmp = path + ".tmp";
  const hid_t f = H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  check(f >= 0, "H5Fcreate", tmp);
  bool ok = true;
  const hid_t g = H5Gcreate2(f, "params", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  ok = ok && g >= 0;
  std::vector<float> host;  // a device's tensor, copied down
  for (std::size_t i = 0; ok && i < store.size(); ++i) {
    const auto& spec = store.spec(i);
    const tensor::Tensor t = store.param(i);
    const void* data = t.data;
    if (t.device != tensor::Device::host) {
      host.resize(static_cast<std::size_t>(t.numel()));
      tensor::download(store.context(), t, host.data());
      data = host.data();
    }
    std::vector<hsize_t> dims;
    for (int d = 0; d < spec.shape.rank; ++d)
      dims.push_back(static_cast<hsize_t>(spec.shape[d]));
    const hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
    const hid_t d = H5Dcreate2(g, spec.name.c_str(), H5T_IEEE_F32LE, space, H5P_DEFAULT,
                               H5P_DEFAULT, H5P_DEFAULT);
    ok = d >= 0 && H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0;
    if (d >= 0) H5Dclose(d);
    H5Sclose(space);
  }
  if (ok) {
    const hid_t s = H5Screate(H5S_SCALAR);
    const hid_t a = H5Acreate2(f, "step", H5T_STD_I64LE, s, H5P_DEFAULT, H5P_DEFAULT);
    const long long v = step;
    ok = a >= 0 && H5Awrite(a, H5T_NATIVE_LLONG, &v) >= 0;
    if (a >= 0) H5Aclose(a);
    H5Sclose(s);
  }
  if (g >= 0) H5Gclose(g);
  ok = H5Fclose(f) >= 0 && ok;
  if (!ok) std::remove(tmp.c_str());
  check(ok, "writing the tensors", tmp);
  check(std::rename(tmp.c_str(), path.c_str()) == 0, "rename to the final name", path);
}

}  // namespace dst::train
