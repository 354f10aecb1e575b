#include "ckpt/param_dump.hpp"

#include <hdf5.h>

#include <cstdio>
#include <optional>
#include <vector>

#include "core/error.hpp"
#include "h5/check.hpp"
#include "h5/handle.hpp"
#include "h5/lock.hpp"

namespace dst::ckpt {

namespace {

/// The `step` attribute of the file.
void write_step(hid_t f, std::int64_t step, const std::string& where) {
  h5::Handle s(DST_H5(H5Screate(H5S_SCALAR), where));
  h5::Handle a(
      DST_H5(H5Acreate2(f, "step", H5T_STD_I64LE, s.get(), H5P_DEFAULT, H5P_DEFAULT), where));
  const long long v = step;
  DST_H5(H5Awrite(a.get(), H5T_NATIVE_LLONG, &v), where + " attribute step");
}

/// One tensor `name` of `shape` under the group `g`.
void write_tensor(hid_t g, const std::string& name, const std::vector<hsize_t>& dims,
                  const void* data, const std::string& at) {
  h5::Handle space(
      DST_H5(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), at));
  h5::Handle d(DST_H5(H5Dcreate2(g, name.c_str(), H5T_IEEE_F32LE, space.get(), H5P_DEFAULT,
                                 H5P_DEFAULT, H5P_DEFAULT),
                      at));
  DST_H5(H5Dwrite(d.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), at);
}

}  // namespace

void write_parameters_h5(const std::string& path, const std::vector<ckpt::TensorRef>& tensors,
                         const std::function<const float*(std::size_t)>& source, std::int64_t step,
                         bool writer) {
  const std::string tmp = path + ".tmp";
  const std::string where = "parameter dump '" + tmp + "'";
  std::optional<Error> failed;
  {
    std::optional<h5::Lock> lock;
    std::optional<h5::Handle> f, g;
    const auto attempt = [&](const std::function<void()>& what) {
      if (failed) return;
      try {
        what();
      } catch (const Error& e) {
        failed = e;
      }
    };
    if (writer)
      attempt([&] {
        lock.emplace();
        f.emplace(DST_H5(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), where));
        g.emplace(
            DST_H5(H5Gcreate2(f->get(), "params", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), where));
      });
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      const float* data = source(i);  // every rank, whatever happened on the writer
      if (!writer) continue;
      attempt([&] {
        const ckpt::TensorRef& t = tensors[i];
        if (t.name.rfind("params/", 0) != 0)
          throw Error(where + ": tensor " + t.name + " is not under params/");
        std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
        write_tensor(g->get(), t.name.substr(7), dims, data, where + " tensor " + t.name);
      });
    }
    if (writer)
      attempt([&] {
        g.reset();
        write_step(f->get(), step, where);
        f->close_checked(where, h5::raise_error);
      });
  }
  if (!writer) return;
  if (failed) {
    std::remove(tmp.c_str());
    throw *failed;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw Error("parameter dump '" + path + "': rename from '" + tmp + "' failed");
}

}  // namespace dst::ckpt
