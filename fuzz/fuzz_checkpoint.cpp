/// \file fuzz_checkpoint.cpp
/// libFuzzer target: checkpoints whose manifest matches (so the hash-before-HDF5 guard
/// passes) but whose content is wrong, through ckpt::Reader (docs/fuzzing.md,
/// docs/checkpoint.md).
///
/// Whoever can write a checkpoint can write a matching manifest (docs/checkpoint.md: the
/// guard detects damage, it does not authenticate), and a writer bug produces exactly
/// such files, so what the reader does after the hash check must hold on its own.
///
/// LLVMFuzzerInitialize saves one real checkpoint (ckpt::Directory::save on
/// MPI_COMM_SELF, three small tensors). Each input copies it and applies up to four
/// mutations chosen by the input (FuzzedDataProvider) with the HDF5 API: delete, retype
/// or revalue an attribute (root metadata or a tensor's checksum); delete a tensor or a
/// /meta dataset; replace a tensor by one of another rank, extent (up to 2^40 per
/// dimension, unwritten), dtype or layout; change a tensor's values; add a group, a
/// dangling or external link, or a stray dataset; replace a /meta dataset by one of
/// another type. Then the manifest is rewritten to match (ckpt::describe_file), or
/// deliberately not, and Reader opens the file, reads every small f32 tensor with its
/// shape and with a wrong shape, and verify_all() checks them all.
///
/// Properties, each a crash (abort) when violated:
/// - failures are CheckpointError (any other exception escapes: a crash);
/// - the unmutated checkpoint with its correct manifest opens and verifies;
/// - a read with the wrong shape is refused;
/// - no HDF5 identifier is left open; ASan/UBSan/LSan; no hang.
///
/// Huge claimed extents (more than kMaxFuzzElements) are generated without storing their
/// data; Reader must refuse them before allocating (finding 4 of docs/fuzzing.md, fixed
/// in list_tensors).
#include <hdf5.h>
#include <mpi.h>
#include <unistd.h>

#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "ckpt/checkpoint.hpp"
#include "ckpt/manifest.hpp"
#include "h5/lock.hpp"
#include "h5_generator.hpp"

namespace {

using dst::fuzz::GiveUp;
using dst::fuzz::Id;
using dst::fuzz::need;
using dst::fuzz::need_ok;

namespace fs = std::filesystem;
using dst::ckpt::CheckpointError;

std::string g_dir;         // /dev/shm/dstrain-fuzz-ckpt-<pid>
std::string g_work;        // the checkpoint each input makes: g_dir/work/step-7.h5
std::string g_base_bytes;  // the valid checkpoint, as saved
std::vector<std::string> g_root_attrs;
std::vector<std::string> g_tensors;  // "params/a", ...
std::vector<std::string> g_meta;     // "meta/deck_yaml", ...
bool g_verbose = false;

constexpr std::int64_t kStep = 7;
// Elements a tensor may claim and still be handed to Reader by default (see the header).
constexpr std::uint64_t kMaxFuzzElements = std::uint64_t{1} << 20;

[[noreturn]] void property_failed(const std::string& what) {
  std::fprintf(stderr, "fuzz_checkpoint: property violated: %s\n", what.c_str());
  std::abort();
}

/// A mutation index in [0, mutations), or -1 (the used-up input's choice: no mutation).
int choice(FuzzedDataProvider& p, int mutations, int good_weight) {
  const int v = p.ConsumeIntegralInRange(0, mutations + good_weight - 1);
  return v < good_weight ? -1 : v - good_weight;
}

template <class T>
const T& pick_of(FuzzedDataProvider& p, const std::vector<T>& v) {
  return v[p.ConsumeIntegralInRange<std::size_t>(0, v.size() - 1)];
}

std::uint64_t odd_value(FuzzedDataProvider& p) {
  switch (p.ConsumeIntegralInRange(0, 5)) {
    case 0:
      return 0;
    case 1:
      return 1;
    case 2:
      return ~std::uint64_t{0};
    case 3:
      return std::uint64_t{1} << p.ConsumeIntegralInRange(8, 63);
    case 4:
      return static_cast<std::uint64_t>(dst::ckpt::kFormatVersion) + 1;
    default:
      return p.ConsumeIntegral<std::uint64_t>();
  }
}

/// Writes attribute `name` of `loc` anew with a type and dataspace chosen by the input.
void write_odd_attr(FuzzedDataProvider& p, hid_t loc, const char* name) {
  if (H5Aexists(loc, name) > 0) need_ok(H5Adelete(loc, name));
  const int kind = p.ConsumeIntegralInRange(0, 6);
  const std::uint64_t v = odd_value(p);
  Id scalar(need(H5Screate(H5S_SCALAR)));
  auto put = [&](hid_t ftype, hid_t mtype, const void* data, hid_t space) {
    Id a(need(H5Acreate2(loc, name, ftype, space, H5P_DEFAULT, H5P_DEFAULT)));
    need_ok(H5Awrite(a.id, mtype, data));
  };
  switch (kind) {
    case 0:
      put(H5T_STD_U64LE, H5T_NATIVE_UINT64, &v, scalar.id);
      break;
    case 1:
      put(H5T_STD_I8LE, H5T_NATIVE_UINT64, &v, scalar.id);
      break;
    case 2: {
      const double d = static_cast<double>(v) / 3.0;
      put(H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &d, scalar.id);
      break;
    }
    case 3: {  // a string, fixed or variable length, possibly long
      std::string text = p.ConsumeBool() ? std::string(p.ConsumeIntegralInRange(0, 70000), 'y')
                                         : p.ConsumeRandomLengthString(32);
      Id t(need(H5Tcopy(H5T_C_S1)));
      if (p.ConsumeBool()) {
        need_ok(H5Tset_size(t.id, H5T_VARIABLE));
        const char* ptr = p.ConsumeBool() ? nullptr : text.c_str();
        put(t.id, t.id, &ptr, scalar.id);
      } else {
        if (text.empty()) text = "x";
        if (text.size() > 60000) text.resize(60000);  // an attribute holds < 64 KiB
        need_ok(H5Tset_size(t.id, text.size()));
        put(t.id, t.id, text.data(), scalar.id);
      }
      break;
    }
    case 4: {  // two values
      const hsize_t dims[1] = {2};
      Id space(need(H5Screate_simple(1, dims, nullptr)));
      const std::uint64_t two[2] = {v, v};
      put(H5T_STD_U64LE, H5T_NATIVE_UINT64, two, space.id);
      break;
    }
    case 5: {  // no value
      Id space(need(H5Screate(H5S_NULL)));
      Id a(need(H5Acreate2(loc, name, H5T_STD_U64LE, space.id, H5P_DEFAULT, H5P_DEFAULT)));
      break;
    }
    default:
      put(H5T_STD_U64BE, H5T_NATIVE_UINT64, &v, scalar.id);
      break;
  }
}

/// Creates dataset `name` with a shape, dtype and layout chosen by the input; returns
/// its element count (saturated).
std::uint64_t write_odd_dataset(FuzzedDataProvider& p, hid_t file, const std::string& name) {
  const int rank = p.ConsumeIntegralInRange(0, 3);
  hsize_t dims[3] = {1, 1, 1};
  std::uint64_t n = 1;
  bool huge = false;
  for (int d = 0; d < rank; ++d) {
    dims[d] = p.ConsumeBool() ? p.ConsumeIntegralInRange<hsize_t>(0, 6)
                              : hsize_t{1} << p.ConsumeIntegralInRange(0, 40);
    n = __builtin_mul_overflow(n, dims[d], &n) ? ~std::uint64_t{0} : n;
  }
  if (n > kMaxFuzzElements) huge = true;
  static const hid_t* const kTypes[] = {&H5T_IEEE_F32LE_g, &H5T_IEEE_F32BE_g, &H5T_IEEE_F64LE_g,
                                        &H5T_STD_I32LE_g, &H5T_STD_U8LE_g};
  const hid_t type = *kTypes[p.ConsumeIntegralInRange<std::size_t>(0, std::size(kTypes) - 1)];
  Id dcpl(need(H5Pcreate(H5P_DATASET_CREATE)));
  if (rank > 0 && (huge || p.ConsumeBool())) {
    hsize_t chunk[3] = {1, 1, 1};
    // Chunks of at most 4096 elements in all: tiny chunks over 2^20 elements made HDF5
    // build a 262k-entry index (2 GB, 11 s) in the generator.
    const hsize_t edge = rank == 1 ? 4096 : rank == 2 ? 64 : 16;
    for (int d = 0; d < rank; ++d)
      chunk[d] = dims[d] == 0 ? 1 : std::min<hsize_t>(dims[d], edge);
    need_ok(H5Pset_chunk(dcpl.id, rank, chunk));
  }
  if (g_verbose)
    std::fprintf(stderr, "dataset %s rank %d dims %llu %llu %llu\n", name.c_str(), rank,
                 static_cast<unsigned long long>(dims[0]), static_cast<unsigned long long>(dims[1]),
                 static_cast<unsigned long long>(dims[2]));
  Id space(need(rank == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(rank, dims, nullptr)));
  Id ds(need(H5Dcreate2(file, name.c_str(), type, space.id, H5P_DEFAULT, dcpl.id, H5P_DEFAULT)));
  if (!huge && n > 0 && p.ConsumeBool()) {  // written (else unwritten: fill values)
    std::vector<float> vals(n);
    for (auto& x : vals)
      x = static_cast<float>(p.ConsumeIntegralInRange(-4, 4));
    need_ok(H5Dwrite(ds.id, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, vals.data()));
  }
  if (p.ConsumeBool()) {  // a checksum attribute, of some value
    const std::uint64_t c = p.ConsumeIntegral<std::uint64_t>();
    Id s(need(H5Screate(H5S_SCALAR)));
    Id a(need(H5Acreate2(ds.id, "checksum_xxh64", H5T_STD_U64LE, s.id, H5P_DEFAULT, H5P_DEFAULT)));
    need_ok(H5Awrite(a.id, H5T_NATIVE_UINT64, &c));
  }
  return n;
}

/// Applies the input's mutations to the checkpoint at g_work. Returns how many, and
/// whether a dataset now claims more than kMaxFuzzElements elements.
int mutate(FuzzedDataProvider& p, bool& huge) {
  Id file(need(H5Fopen(g_work.c_str(), H5F_ACC_RDWR, H5P_DEFAULT)));
  int applied = 0;
  const int count = p.ConsumeIntegralInRange(0, 4);
  for (int i = 0; i < count; ++i) {
    const int kind = choice(p, 9, 1);
    if (kind < 0) continue;
    ++applied;
    if (g_verbose) std::fprintf(stderr, "mutation %d\n", kind);
    switch (kind) {
      case 0: {  // delete a root attribute
        const std::string& a = pick_of(p, g_root_attrs);
        if (H5Aexists(file.id, a.c_str()) > 0) need_ok(H5Adelete(file.id, a.c_str()));
        break;
      }
      case 1:  // retype or revalue a root attribute
        write_odd_attr(p, file.id, pick_of(p, g_root_attrs).c_str());
        break;
      case 2: {  // a tensor's checksum attribute: gone or odd
        const std::string& t = pick_of(p, g_tensors);
        if (H5Lexists(file.id, t.c_str(), H5P_DEFAULT) <= 0) break;
        Id ds(need(H5Oopen(file.id, t.c_str(), H5P_DEFAULT)));
        if (p.ConsumeBool()) {
          if (H5Aexists(ds.id, "checksum_xxh64") > 0) need_ok(H5Adelete(ds.id, "checksum_xxh64"));
        } else {
          write_odd_attr(p, ds.id, "checksum_xxh64");
        }
        break;
      }
      case 3: {  // delete a tensor or a /meta dataset
        const std::string& t = p.ConsumeBool() ? pick_of(p, g_tensors) : pick_of(p, g_meta);
        if (H5Lexists(file.id, t.c_str(), H5P_DEFAULT) > 0)
          need_ok(H5Ldelete(file.id, t.c_str(), H5P_DEFAULT));
        break;
      }
      case 4: {  // replace a tensor by another shape / dtype / layout
        const std::string& t = pick_of(p, g_tensors);
        if (H5Lexists(file.id, t.c_str(), H5P_DEFAULT) > 0)
          need_ok(H5Ldelete(file.id, t.c_str(), H5P_DEFAULT));
        huge = write_odd_dataset(p, file.id, t) > kMaxFuzzElements || huge;
        break;
      }
      case 5: {  // change one value of a tensor (its checksum no longer matches)
        const std::string& t = pick_of(p, g_tensors);
        if (H5Lexists(file.id, t.c_str(), H5P_DEFAULT) <= 0) break;
        Id ds(need(H5Dopen2(file.id, t.c_str(), H5P_DEFAULT)));
        Id space(need(H5Dget_space(ds.id)));
        const hssize_t n = H5Sget_simple_extent_npoints(space.id);
        if (n <= 0 || n > static_cast<hssize_t>(kMaxFuzzElements)) break;
        std::vector<float> vals(static_cast<std::size_t>(n));
        need_ok(H5Dread(ds.id, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, vals.data()));
        vals[p.ConsumeIntegralInRange<std::size_t>(0, vals.size() - 1)] += 1.0f;
        need_ok(H5Dwrite(ds.id, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, vals.data()));
        break;
      }
      case 6: {  // something extra: a group, links, a stray dataset (also under /meta)
        const std::string name =
            (p.ConsumeBool() ? "extra/" : "meta/") + std::to_string(p.ConsumeIntegralInRange(0, 3));
        if (H5Lexists(file.id, "extra", H5P_DEFAULT) <= 0) {
          Id g(need(H5Gcreate2(file.id, "extra", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
        }
        if (H5Lexists(file.id, name.c_str(), H5P_DEFAULT) > 0) break;
        switch (p.ConsumeIntegralInRange(0, 3)) {
          case 0: {
            Id g(need(H5Gcreate2(file.id, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
            break;
          }
          case 1:
            need_ok(H5Lcreate_soft("/nowhere", file.id, name.c_str(), H5P_DEFAULT, H5P_DEFAULT));
            break;
          case 2:
            need_ok(H5Lcreate_external("/nonexistent/dstrain-fuzz.h5", "/x", file.id, name.c_str(),
                                       H5P_DEFAULT, H5P_DEFAULT));
            break;
          default:
            huge = write_odd_dataset(p, file.id, name) > kMaxFuzzElements || huge;
            break;
        }
        break;
      }
      case 7: {  // a /meta dataset of another type (an integer dataset, a long string)
        const std::string& m = pick_of(p, g_meta);
        if (H5Lexists(file.id, m.c_str(), H5P_DEFAULT) > 0)
          need_ok(H5Ldelete(file.id, m.c_str(), H5P_DEFAULT));
        if (p.ConsumeBool()) {
          huge = write_odd_dataset(p, file.id, m) > kMaxFuzzElements || huge;
        } else {
          const std::string text = p.ConsumeRandomLengthString(256);
          Id t(need(H5Tcopy(H5T_C_S1)));
          need_ok(H5Tset_size(t.id, std::max<std::size_t>(text.size(), 1)));
          Id s(need(H5Screate(H5S_SCALAR)));
          Id ds(need(
              H5Dcreate2(file.id, m.c_str(), t.id, s.id, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
          std::string buf = text.empty() ? std::string("x") : text;
          need_ok(H5Dwrite(ds.id, t.id, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()));
        }
        break;
      }
      default: {  // a tensor name that is a group holding a tensor
        const std::string& t = pick_of(p, g_tensors);
        if (H5Lexists(file.id, t.c_str(), H5P_DEFAULT) > 0)
          need_ok(H5Ldelete(file.id, t.c_str(), H5P_DEFAULT));
        Id g(need(H5Gcreate2(file.id, t.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
        huge = write_odd_dataset(p, g.id, "inner") > kMaxFuzzElements || huge;
        break;
      }
    }
  }
  return applied;
}

void check_no_open_ids(const char* after) {
  const ssize_t open = H5Fget_obj_count(static_cast<hid_t>(H5F_OBJ_ALL), H5F_OBJ_ALL);
  if (open != 0)
    property_failed(std::string("HDF5 identifiers left open after ") + after + ": " +
                    std::to_string(open));
}

herr_t collect_attr(hid_t, const char* name, const H5A_info_t*, void* out) {
  static_cast<std::vector<std::string>*>(out)->emplace_back(name);
  return 0;
}
herr_t collect_dataset(hid_t loc, const char* name, const H5O_info_t* info, void* out) {
  if (info->type == H5O_TYPE_DATASET) {
    (void)loc;
    static_cast<std::vector<std::string>*>(out)->emplace_back(name);
  }
  return 0;
}

std::uint64_t numel(const std::vector<std::int64_t>& shape) {
  std::uint64_t n = 1;
  for (auto d : shape)
    if (__builtin_mul_overflow(n, static_cast<std::uint64_t>(d), &n)) return ~std::uint64_t{0};
  return n;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  g_verbose = std::getenv("DSTRAIN_FUZZ_VERBOSE") != nullptr;
  H5open();
  H5set_free_list_limits(0, 0, 0, 0, 0, 0);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const char* tmp = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  g_dir = std::string(tmp) + "/dstrain-fuzz-ckpt-" + std::to_string(getpid());
  fs::create_directories(g_dir + "/work");
  std::atexit([] {
    std::error_code ec;
    fs::remove_all(g_dir, ec);
  });

  // One real checkpoint: three small tensors, the metadata a run writes.
  const std::vector<float> a(12, 0.5f), b{1, 2, 3, 4, 5}, c(8, -1.0f);
  dst::ckpt::Metadata meta;
  meta.step = kStep;
  meta.rng = "1234 0";
  meta.deck_yaml = "run:\n  name: fuzz\n";
  meta.tokenizer_name = "byte260";
  meta.tokenizer_json = "{}";
  meta.software_version = "dstrain fuzz";
  dst::ckpt::Directory dir(MPI_COMM_SELF, g_dir + "/base", 30.0);
  dst::ckpt::IoOptions io;
  io.alignment = 1;  // a small file: every input copies it
  dir.set_io_options(io);
  dir.save(meta,
           {{"params/a", {4, 3}, a.data()},
            {"params/b", {5}, b.data()},
            {"optimizer/exp_avg/c", {2, 2, 2}, c.data()}},
           0);
  const std::string base = dir.latest();
  {
    std::ifstream in(base, std::ios::binary);
    g_base_bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  g_work = g_dir + "/work/" + fs::path(base).filename().string();

  dst::h5::Lock lock;
  const hid_t f = H5Fopen(base.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hsize_t idx = 0;
  H5Aiterate2(f, H5_INDEX_NAME, H5_ITER_INC, &idx, collect_attr, &g_root_attrs);
  std::vector<std::string> datasets;
  H5Ovisit(f, H5_INDEX_NAME, H5_ITER_INC, collect_dataset, &datasets);
  H5Fclose(f);
  for (const auto& d : datasets)
    (d.rfind("meta/", 0) == 0 ? g_meta : g_tensors).push_back(d);
  if (g_root_attrs.empty() || g_tensors.size() != 3 || g_meta.empty()) {
    std::fprintf(stderr, "fuzz_checkpoint: unexpected base checkpoint %s\n", base.c_str());
    std::abort();
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider p(data, size);
  {
    std::ofstream out(g_work, std::ios::binary | std::ios::trunc);
    out.write(g_base_bytes.data(), static_cast<std::streamsize>(g_base_bytes.size()));
  }
  int applied = 0;
  bool huge = false;
  {
    dst::h5::Lock lock;
    try {
      applied = mutate(p, huge);
    } catch (const GiveUp&) {
      check_no_open_ids("the mutator");
      return 0;
    }
    check_no_open_ids("the mutator");
  }
  (void)huge;  // huge claimed extents reach Reader too (list_tensors refuses them)

  // The manifest: matching, or not.
  const int manifest_kind = choice(p, 5, 4);
  dst::ckpt::Manifest m = dst::ckpt::describe_file(g_work, kStep, "2026-01-01T00:00:00Z");
  switch (manifest_kind) {
    case 0:
      m.size += 1;
      break;
    case 1:
      m.xxh64 ^= 1;
      break;
    case 2:
      m.file = "step-8.h5";
      break;
    case 3:
      m.checkpoint_format_version += 1;
      break;
    default:
      break;
  }
  const std::string mpath = dst::ckpt::manifest_path(g_work);
  if (manifest_kind == 4) {
    std::ofstream(mpath, std::ios::binary | std::ios::trunc) << p.ConsumeRandomLengthString(200);
  } else {
    dst::ckpt::write_manifest(mpath, m);
  }
  const bool pristine = applied == 0 && manifest_kind < 0;

  try {
    dst::ckpt::Reader r(MPI_COMM_SELF, g_work, 30.0);
    for (const auto& t : r.tensors()) {
      const std::uint64_t n = numel(t.shape);
      if (t.dtype != "f32" || n > kMaxFuzzElements) continue;
      std::vector<float> buf(n + 1);
      try {
        r.read(t.name, t.shape, buf.data());
      } catch (const CheckpointError& e) {
        if (pristine) property_failed(std::string("pristine checkpoint: ") + e.what());
      }
      std::vector<std::int64_t> wrong = t.shape;
      wrong.push_back(1);
      bool refused = false;
      try {
        r.read(t.name, wrong, buf.data());
      } catch (const CheckpointError&) {
        refused = true;
      }
      if (!refused) property_failed("a read with a wrong shape was not refused: " + t.name);
    }
    const auto bad = r.verify_all();
    if (pristine && !bad.empty()) property_failed("pristine checkpoint fails verify_all");
    if (g_verbose)
      std::fprintf(stderr, "opened: %zu tensors, %zu bad\n", r.tensors().size(), bad.size());
  } catch (const CheckpointError& e) {
    if (g_verbose) std::fprintf(stderr, "refused: %s\n", e.what());
    if (pristine) property_failed(std::string("pristine checkpoint refused: ") + e.what());
  }
  check_no_open_ids("Reader");
  return 0;
}
