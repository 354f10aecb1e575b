/// \file fuzz_shard.cpp
/// libFuzzer target: token shards that are valid HDF5 but carry wrong shapes, dtypes,
/// sizes, layouts, links and attributes, through the dataset layer's checks and reader
/// (docs/fuzzing.md, docs/dataset.md).
///
/// The input does not become the file's bytes (libhdf5's own parser is not what is under
/// test: see docs/fuzzing.md, "What is not guarded"). It drives a generator
/// (FuzzedDataProvider) that writes a shard with the HDF5 API to a file on tmpfs, choosing
/// per field: present or missing; the attribute's class, integer width, byte order, value
/// and dataspace; the datasets' dtype, rank, extent, layout (contiguous, chunked, sparse
/// chunked, compact, deflated) and whether the name is a dataset, a group, a committed
/// datatype or a (dangling) link; the token ids and document offsets, correct or broken.
///
/// Half of the inputs stop there (the dataset is that shard); the others write a second
/// shard the same way and name both with a manifest (whose lines are also chosen: names,
/// comments, blank lines, CR, `.tmp`, absolute, missing, anything) or a glob.
///
/// Then, with what the project runs on a dataset:
///   resolve_shard_paths -> per shard validate_shard(header), validate_shard(full) ->
///   check_shards_agree -> open_dataset(MPI_COMM_SELF) -> BatchReader (no prefetch, one
///   shard open at a time) reading the first, a middle and the last sample,
/// properties, each a crash (abort) when violated:
/// - every failure is a DatasetError (any other exception escapes: a crash);
/// - a shard that passes ShardCheck::full satisfies rules 1-7 of docs/dataset.md as
///   checked here by an independent reader (the whole file read as uint64); when every
///   shard does and they agree, samples (also across shard boundaries) read back as
///   exactly those tokens;
/// - open_dataset refuses a dataset with a shard the header check refuses, or with
///   shards that disagree;
/// - no HDF5 identifier is left open after the checks (H5Fget_obj_count);
/// - ASan/UBSan/LSan: no over-read, no undefined behaviour, no leak; no hang.
#include <hdf5.h>
#include <mpi.h>
#include <unistd.h>

#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "data/dataset/batch_reader.hpp"
#include "data/dataset/dataset_error.hpp"
#include "data/dataset/shard_format.hpp"
#include "data/dataset/token_dataset.hpp"
#include "h5/lock.hpp"
#include "h5_generator.hpp"

namespace {

using dst::fuzz::GiveUp;
using dst::fuzz::Id;
using dst::fuzz::need;
using dst::fuzz::need_ok;

using dst::data::DatasetError;

// The files, on tmpfs, one set per process: two shards and a manifest naming them.
std::string g_dir, g_name_a, g_name_b, g_path_a, g_path_b, g_manifest;
bool g_verbose = false;  // DSTRAIN_FUZZ_VERBOSE: say why each input was refused

[[noreturn]] void property_failed(const std::string& what) {
  std::fprintf(stderr, "fuzz_shard: property violated: %s\n", what.c_str());
  std::abort();
}

// Bounds of what the generator writes: small files, so thousands of runs per minute.
constexpr int kMaxDocs = 16;
constexpr int kMaxDocLen = 48;
constexpr hsize_t kMaxWritten = 4096;

/// A mutation index in [0, mutations), or -1 for the correct choice (weight good_weight).
/// FuzzedDataProvider gives 0 when the input is used up, and 0 is the correct choice: the
/// empty input writes a valid shard and each byte of a seed breaks one field.
int choice(FuzzedDataProvider& p, int mutations, int good_weight) {
  const int v = p.ConsumeIntegralInRange(0, mutations + good_weight - 1);
  return v < good_weight ? -1 : v - good_weight;
}

/// An integer in [lo, hi] that is `dflt` when the input is used up.
int pick(FuzzedDataProvider& p, int lo, int hi, int dflt) {
  const int raw = p.ConsumeIntegralInRange(lo, hi);
  return lo + (raw - lo + dflt - lo) % (hi - lo + 1);
}

// Integer file types a writer might use for an attribute or dataset.
hid_t pick_int_type(FuzzedDataProvider& p) {
  static const hid_t* const kTypes[] = {&H5T_STD_U8LE_g,  &H5T_STD_I8LE_g,  &H5T_STD_U16LE_g,
                                        &H5T_STD_I16LE_g, &H5T_STD_U32LE_g, &H5T_STD_I32LE_g,
                                        &H5T_STD_U64LE_g, &H5T_STD_I64LE_g, &H5T_STD_U16BE_g,
                                        &H5T_STD_U32BE_g, &H5T_STD_U64BE_g, &H5T_STD_I64BE_g};
  H5open();  // the H5T_* globals are set by the library's initialisation
  return *kTypes[p.ConsumeIntegralInRange<std::size_t>(0, std::size(kTypes) - 1)];
}

// A 64-bit value: mostly `good`, else an edge case or anything.
std::uint64_t mutate_value(FuzzedDataProvider& p, std::uint64_t good) {
  switch (choice(p, 6, 4)) {
    case 0:
      return good + 1;
    case 1:
      return good - 1;  // wraps for 0: a huge value
    case 2:
      return 0;
    case 3:
      return std::uint64_t{1} << p.ConsumeIntegralInRange(15, 63);
    case 4:
      return p.ConsumeIntegral<std::uint64_t>();
    case 5:
      return ~std::uint64_t{p.ConsumeIntegral<std::uint8_t>()};  // "negative"
    default:
      return good;
  }
}

void write_scalar_attr(hid_t loc, const char* name, hid_t file_type, hid_t mem_type, const void* v,
                       hid_t space) {
  Id a(need(H5Acreate2(loc, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT)));
  need_ok(H5Awrite(a.id, mem_type, v));
}

/// An integer attribute whose correct value is `good`: missing, mistyped, an array, a
/// null dataspace, another value, or right.
void gen_int_attr(FuzzedDataProvider& p, hid_t root, const char* name, std::uint64_t good) {
  const int mode = choice(p, 7, 5);
  if (mode == 0) return;  // missing
  Id scalar(need(H5Screate(H5S_SCALAR)));
  if (mode == 1) {  // a float
    const double v = static_cast<double>(good) + (p.ConsumeBool() ? 0.5 : 0.0);
    write_scalar_attr(root, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &v, scalar.id);
    return;
  }
  if (mode == 2) {  // a string holding the number
    const std::string text = std::to_string(good);
    Id t(need(H5Tcopy(H5T_C_S1)));
    need_ok(H5Tset_size(t.id, text.size() + 1));
    write_scalar_attr(root, name, t.id, t.id, text.c_str(), scalar.id);
    return;
  }
  const std::uint64_t v = mode == 3 ? mutate_value(p, good) : good;
  const hid_t file_type = p.ConsumeBool() ? pick_int_type(p) : H5T_STD_U64LE;
  if (mode == 4) {  // two values
    const hsize_t dims[1] = {2};
    Id space(need(H5Screate_simple(1, dims, nullptr)));
    const std::uint64_t vals[2] = {v, v};
    write_scalar_attr(root, name, file_type, H5T_NATIVE_UINT64, vals, space.id);
    return;
  }
  if (mode == 5) {  // a null dataspace (no value at all)
    Id space(need(H5Screate(H5S_NULL)));
    Id a(need(H5Acreate2(root, name, file_type, space.id, H5P_DEFAULT, H5P_DEFAULT)));
    return;
  }
  if (mode == 6) {  // a (1,1) array: one value, rank 2
    const hsize_t dims[2] = {1, 1};
    Id space(need(H5Screate_simple(2, dims, nullptr)));
    write_scalar_attr(root, name, file_type, H5T_NATIVE_UINT64, &v, space.id);
    return;
  }
  write_scalar_attr(root, name, file_type, H5T_NATIVE_UINT64, &v, scalar.id);
}

/// A string attribute whose correct value is `good`.
void gen_string_attr(FuzzedDataProvider& p, hid_t root, const char* name, const std::string& good) {
  const int mode = choice(p, 8, 4);
  if (mode == 0) return;  // missing
  Id scalar(need(H5Screate(H5S_SCALAR)));
  if (mode == 1) {  // an integer
    const std::uint32_t v = 1;
    write_scalar_attr(root, name, H5T_STD_U32LE, H5T_NATIVE_UINT32, &v, scalar.id);
    return;
  }
  std::string text = good;
  switch (mode) {
    case 2:
      text = "";
      break;
    case 3:
      text = std::string(p.ConsumeIntegralInRange<std::size_t>(4090, 5000), 'x');
      break;
    case 4:
      text = p.ConsumeRandomLengthString(64);
      break;
    case 5:
      text = good + std::string(1, '\0') + "tail";
      break;  // embedded NUL
    default:
      break;
  }
  Id t(need(H5Tcopy(H5T_C_S1)));
  if (p.ConsumeBool()) need_ok(H5Tset_cset(t.id, H5T_CSET_UTF8));
  const bool vlen = p.ConsumeBool();
  if (vlen) {
    need_ok(H5Tset_size(t.id, H5T_VARIABLE));
    const char* ptr = mode == 6 ? nullptr : text.c_str();  // a NULL vlen string
    if (mode == 7) {                                       // two strings
      const hsize_t dims[1] = {2};
      Id space(need(H5Screate_simple(1, dims, nullptr)));
      const char* two[2] = {ptr, ptr};
      write_scalar_attr(root, name, t.id, t.id, two, space.id);
      return;
    }
    write_scalar_attr(root, name, t.id, t.id, &ptr, scalar.id);
    return;
  }
  // Fixed length: exactly the text (no NUL stored), or NUL/space padded into more room.
  const std::size_t size = std::max<std::size_t>(
      1, text.size() + (p.ConsumeBool() ? 0 : p.ConsumeIntegralInRange<std::size_t>(0, 8)));
  need_ok(H5Tset_size(t.id, size));
  switch (p.ConsumeIntegralInRange(0, 2)) {
    case 0:
      need_ok(H5Tset_strpad(t.id, H5T_STR_NULLTERM));
      break;
    case 1:
      need_ok(H5Tset_strpad(t.id, H5T_STR_NULLPAD));
      break;
    default:
      need_ok(H5Tset_strpad(t.id, H5T_STR_SPACEPAD));
      break;
  }
  std::string buf = text;
  buf.resize(size, '\0');
  write_scalar_attr(root, name, t.id, t.id, buf.data(), scalar.id);
}

/// A 1-D (or not) integer dataset `name` holding `values` (or not quite).
void gen_dataset(FuzzedDataProvider& p, hid_t file, const char* name, hid_t good_type,
                 const std::vector<std::uint64_t>& values) {
  // What `name` is.
  switch (choice(p, 5, 11)) {
    case 0:
      return;  // missing
    case 1: {  // a group
      Id g(need(H5Gcreate2(file, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
      return;
    }
    case 2: {  // a committed datatype
      Id t(need(H5Tcopy(good_type)));
      need_ok(H5Tcommit2(file, name, t.id, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
      return;
    }
    case 3:  // a dangling soft link
      need_ok(H5Lcreate_soft("/nowhere", file, name, H5P_DEFAULT, H5P_DEFAULT));
      return;
    case 4:  // an external link to a file that is not there
      need_ok(H5Lcreate_external("/nonexistent/dstrain-fuzz.h5", "/tokens", file, name, H5P_DEFAULT,
                                 H5P_DEFAULT));
      return;
    default:
      break;
  }

  // Element type.
  hid_t type = good_type;
  switch (choice(p, 3, 7)) {
    case 0:
      type = pick_int_type(p);
      break;
    case 1:
      type = H5T_IEEE_F32LE;
      break;
    case 2:
      type = H5T_IEEE_F64LE;
      break;
    default:
      break;
  }

  // Extent: the values' count, or a different one (possibly huge, then nothing is written).
  const hsize_t n = values.size();
  hsize_t extent = n;
  switch (choice(p, 3, 7)) {
    case 0:
      extent = n + p.ConsumeIntegralInRange<hsize_t>(1, 64);
      break;
    case 1:
      extent = n > 0 ? n - 1 : 0;
      break;
    case 2:
      extent = hsize_t{1} << p.ConsumeIntegralInRange(20, 60);
      break;
    default:
      break;
  }
  const bool huge = extent > kMaxWritten;

  // Rank: 1, or 2 (extent x 1, 1 x extent), or a scalar.
  int rank = 1;
  hsize_t dims[2] = {extent, 1};
  switch (choice(p, 3, 9)) {
    case 0:
      rank = 2;
      break;
    case 1:
      rank = 2, dims[0] = 1, dims[1] = extent;
      break;
    case 2:
      rank = 0;
      break;
    default:
      break;
  }

  // Layout.
  Id dcpl(need(H5Pcreate(H5P_DATASET_CREATE)));
  int layout =
      p.ConsumeIntegralInRange(0, 5);  // 0,1 contiguous; 2 chunked; 3 sparse; 4 compact; 5 deflate
  if (rank == 0 && layout >= 2) layout = 0;  // scalars cannot be chunked
  bool sparse = layout == 3;
  hsize_t maxdims[2] = {dims[0], dims[1]};
  if (layout >= 2 && layout != 4) {
    hsize_t chunk[2] = {p.ConsumeIntegralInRange<hsize_t>(1, 512), 1};
    if (rank == 2)
      chunk[1] = 1, chunk[0] = std::min<hsize_t>(chunk[0], std::max<hsize_t>(dims[0], 1));
    need_ok(H5Pset_chunk(dcpl.id, rank, chunk));
    if (p.ConsumeBool()) maxdims[0] = H5S_UNLIMITED;
    if (layout == 5) {
      if (H5Zfilter_avail(H5Z_FILTER_DEFLATE) <= 0) throw GiveUp{};
      need_ok(H5Pset_deflate(dcpl.id, p.ConsumeIntegralInRange(1, 9)));
    }
  } else if (layout == 4) {
    if (huge) throw GiveUp{};
    need_ok(H5Pset_layout(dcpl.id, H5D_COMPACT));
  }
  if (choice(p, 1, 7) == 0) {  // a fill value that is not 0
    const std::uint64_t fill = mutate_value(p, 7);
    need_ok(H5Pset_fill_value(dcpl.id, H5T_NATIVE_UINT64, &fill));
    if (p.ConsumeBool()) need_ok(H5Pset_alloc_time(dcpl.id, H5D_ALLOC_TIME_EARLY));
    if (huge) throw GiveUp{};  // early allocation of a huge extent would fill tmpfs
  }

  Id space(need(rank == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(rank, dims, maxdims)));
  Id ds(need(H5Dcreate2(file, name, type, space.id, H5P_DEFAULT, dcpl.id, H5P_DEFAULT)));
  if (huge) return;  // claims more than it stores

  // Write all of the extent that `values` covers (sparse: only the first part).
  hsize_t count = std::min<hsize_t>(n, extent);
  if (sparse) count = std::min<hsize_t>(count, p.ConsumeIntegralInRange<hsize_t>(0, count));
  if (rank == 0) count = std::min<hsize_t>(count, 1);
  if (count == 0) return;
  std::vector<std::uint64_t> buf(values.begin(),
                                 values.begin() + static_cast<std::ptrdiff_t>(count));
  if (rank == 0) {
    need_ok(H5Dwrite(ds.id, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()));
    return;
  }
  Id fspace(need(H5Dget_space(ds.id)));
  hsize_t start[2] = {0, 0}, cnt[2] = {count, 1};
  if (rank == 2 && dims[0] == 1) cnt[0] = 1, cnt[1] = count;
  need_ok(H5Sselect_hyperslab(fspace.id, H5S_SELECT_SET, start, nullptr, cnt, nullptr));
  const hsize_t mdims[1] = {count};
  Id mspace(need(H5Screate_simple(1, mdims, nullptr)));
  need_ok(H5Dwrite(ds.id, H5T_NATIVE_UINT64, mspace.id, fspace.id, H5P_DEFAULT, buf.data()));
}

/// What the generator meant to write (for the seq_len and sample choices below).
struct Plan {
  int seq_len = 1;
  std::uint64_t sample_pick = 0;
  std::uint64_t vocab = 0, eos = 0;  ///< of the first shard: the second agrees by default
};

/// Writes the shard at `path` from the input; throws GiveUp when HDF5 refused a choice.
void generate(FuzzedDataProvider& p, Plan& plan, const std::string& path) {
  // The intended content: documents of token ids, each ended by EOS.
  static const std::uint64_t kVocabs[] = {260, 1, 2, 3, 65535, 65536, 65537, 102400, 2147483647};
  const bool second = plan.vocab != 0;
  std::uint64_t vocab = kVocabs[p.ConsumeIntegralInRange<std::size_t>(0, std::size(kVocabs) - 1)];
  if (second && vocab == kVocabs[0]) vocab = plan.vocab;  // the default: as the first shard
  std::uint64_t eos = second && vocab == plan.vocab ? plan.eos : vocab - 1;
  if (choice(p, 1, 7) == 0) eos = p.ConsumeIntegralInRange<std::uint64_t>(0, vocab - 1);
  if (!second) plan.vocab = vocab, plan.eos = eos;
  const int docs = pick(p, 0, kMaxDocs, 3);
  std::vector<std::uint64_t> tokens;
  std::vector<std::uint64_t> offsets{0};
  for (int d = 0; d < docs; ++d) {
    const int len = pick(p, 0, kMaxDocLen, 5);
    for (int i = 0; i < len; ++i)
      tokens.push_back(
          p.ConsumeIntegralInRange<std::uint64_t>(0, std::min<std::uint64_t>(vocab, 65536) - 1));
    tokens.push_back(eos);
    offsets.push_back(tokens.size());
  }
  // Breakage of the content itself.
  const int breaks = p.ConsumeIntegralInRange(0, 3);
  for (int b = 0; b < breaks && !tokens.empty(); ++b) {
    const std::size_t i = p.ConsumeIntegralInRange<std::size_t>(0, tokens.size() - 1);
    tokens[i] = mutate_value(p, vocab);
  }
  const int obreaks = p.ConsumeIntegralInRange(0, 2);
  for (int b = 0; b < obreaks; ++b) {
    const std::size_t i = p.ConsumeIntegralInRange<std::size_t>(0, offsets.size() - 1);
    offsets[i] = mutate_value(p, offsets[i]);
  }
  const bool u32 = vocab > 65536 || p.ConsumeIntegralInRange(0, 3) == 0;

  plan.seq_len = p.ConsumeIntegralInRange(1, 64);
  plan.sample_pick = p.ConsumeIntegral<std::uint64_t>();

  Id fapl(need(H5Pcreate(H5P_FILE_ACCESS)));
  if (p.ConsumeBool()) need_ok(H5Pset_libver_bounds(fapl.id, H5F_LIBVER_LATEST, H5F_LIBVER_LATEST));
  Id file(need(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.id)));
  Id root(need(H5Gopen2(file.id, "/", H5P_DEFAULT)));
  // Attributes first or datasets first: both orders occur in real writers.
  const bool attrs_first = p.ConsumeBool();
  auto attrs = [&] {
    gen_string_attr(p, root.id, "format", dst::data::kShardFormatName);
    gen_int_attr(p, root.id, "format_version", dst::data::kShardFormatVersion);
    gen_int_attr(p, root.id, "vocab_size", vocab);
    gen_int_attr(p, root.id, "eos_id", eos);
    gen_string_attr(p, root.id, "tokenizer_name", "fuzz");
    gen_string_attr(p, root.id, "tokenizer_hash", "fnv1a64:0123456789abcdef");
    gen_int_attr(p, root.id, "num_tokens", tokens.size());
    gen_int_attr(p, root.id, "num_documents", static_cast<std::uint64_t>(docs));
  };
  if (attrs_first) attrs();
  gen_dataset(p, file.id, dst::data::kTokensDataset, u32 ? H5T_STD_U32LE : H5T_STD_U16LE, tokens);
  gen_dataset(p, file.id, dst::data::kOffsetsDataset, H5T_STD_U64LE, offsets);
  if (!attrs_first) attrs();
}

/// Writes the manifest: mostly the two shards' names, or comments, blank lines, CR line
/// ends, a `.tmp`, an absolute path, a missing file, anything.
void write_manifest(FuzzedDataProvider& p) {
  std::string text;
  const int lines = pick(p, 1, 5, 2);
  for (int i = 0; i < lines; ++i) {
    const std::string& shard = i % 2 == 0 ? g_name_a : g_name_b;
    switch (choice(p, 8, 4)) {
      case 0:
        text += "# a comment\n";
        break;
      case 1:
        text += "\n";
        break;
      case 2:
        text += "  " + shard + " \r\n";
        break;
      case 3:
        text += shard + ".tmp\n";
        break;
      case 4:
        text += g_dir + "/" + shard + "\n";
        break;
      case 5:
        text += "missing-" + shard + "\n";
        break;
      case 6:
        text += p.ConsumeRandomLengthString(40) + "\n";
        break;
      case 7:
        text += "./" + shard;
        break;  // no final newline
      default:
        text += shard + "\n";
        break;
    }
  }
  std::FILE* f = std::fopen(g_manifest.c_str(), "wb");
  if (f == nullptr) throw GiveUp{};
  std::fwrite(text.data(), 1, text.size(), f);
  std::fclose(f);
}

// ---- the independent reader: rules 1-7 of docs/dataset.md, read as uint64 ----

std::vector<std::uint64_t> read_all_u64(hid_t file, const char* name, std::uint64_t n) {
  std::vector<std::uint64_t> v(n);
  Id ds(H5Dopen2(file, name, H5P_DEFAULT));
  if (!ds.ok() ||
      (n > 0 && H5Dread(ds.id, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0))
    property_failed(std::string("accepted shard: the reference reader cannot read ") + name);
  return v;
}

/// Checks an accepted shard's content against its header; returns the tokens.
std::vector<std::uint64_t> reference_check(const dst::data::ShardHeader& h) {
  Id file(H5Fopen(h.path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (!file.ok()) property_failed("accepted shard: the reference reader cannot open it");
  // Sizes were checked by the validator against the datasets; a mismatch would have made
  // the H5Dread above fail or over-read (ASan).
  const auto tokens = read_all_u64(file.id, dst::data::kTokensDataset, h.num_tokens);
  const auto off = read_all_u64(file.id, dst::data::kOffsetsDataset, h.num_documents + 1);
  if (h.vocab_size < 1 || h.vocab_size > dst::data::kMaxVocabSize || h.eos_id >= h.vocab_size)
    property_failed("accepted shard: vocab_size/eos_id out of range");
  if (h.token_bytes != 2 && h.token_bytes != 4) property_failed("accepted shard: token_bytes");
  if (h.token_bytes == 2 && h.vocab_size > dst::data::kMaxVocabForUint16)
    property_failed("accepted shard: uint16 tokens for a vocabulary > 65536");
  if (off.front() != 0 || off.back() != h.num_tokens)
    property_failed("accepted shard: doc_offsets does not span [0, num_tokens]");
  for (std::size_t d = 1; d < off.size(); ++d)
    if (off[d] <= off[d - 1]) property_failed("accepted shard: doc_offsets not increasing");
  for (std::size_t d = 1; d < off.size(); ++d)  // off[d] in [1, num_tokens] now
    if (tokens[off[d] - 1] != h.eos_id) property_failed("accepted shard: document without EOS");
  for (std::uint64_t t : tokens)
    if (t >= h.vocab_size) property_failed("accepted shard: token id outside the vocabulary");
  return tokens;
}

void check_no_open_ids(const char* after) {
  const ssize_t open = H5Fget_obj_count(static_cast<hid_t>(H5F_OBJ_ALL), H5F_OBJ_ALL);
  if (open != 0)
    property_failed(std::string("HDF5 identifiers left open after ") + after + ": " +
                    std::to_string(open));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  g_verbose = std::getenv("DSTRAIN_FUZZ_VERBOSE") != nullptr;
  H5open();
  // No free lists: HDF5 then returns memory as it goes, so LeakSanitizer's per-input
  // check sees a real leak instead of a cache growing.
  H5set_free_list_limits(0, 0, 0, 0, 0, 0);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // the generator's refusals are quiet
  const char* dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  g_dir = dir;
  const std::string stem = "dstrain-fuzz-shard-" + std::to_string(getpid());
  g_name_a = stem + "-a.h5";
  g_name_b = stem + "-b.h5";
  g_path_a = g_dir + "/" + g_name_a;
  g_path_b = g_dir + "/" + g_name_b;
  g_manifest = g_dir + "/" + stem + ".manifest";
  std::atexit([] {
    std::remove(g_path_a.c_str());
    std::remove(g_path_b.c_str());
    std::remove(g_manifest.c_str());
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider p(data, size);
  Plan plan;
  // The dataset: shard a alone (a used-up input), or a manifest or glob naming a and b.
  std::string source = g_path_a;
  {
    dst::h5::Lock lock;  // as every HDF5 user in the process must
    std::remove(g_path_b.c_str());
    try {
      const int mode = choice(p, 2, 2);  // drawn first: the generator may use up the input
      generate(p, plan, g_path_a);
      Plan second = plan;  // seq_len and the sample stay the first shard's
      switch (mode) {
        case 0:
          generate(p, second, g_path_b);
          write_manifest(p);
          source = g_manifest;
          break;
        case 1:
          generate(p, second, g_path_b);
          source = g_dir + "/dstrain-fuzz-shard-" + std::to_string(getpid()) + "-[ab].h5";
          break;
        default:
          break;
      }
    } catch (const GiveUp&) {
      if (g_verbose) std::fprintf(stderr, "generator gave up\n");
      check_no_open_ids("the generator");
      return 0;
    }
    check_no_open_ids("the generator");
  }

  // Each shard the source names, through the checks, and the reference reader on those
  // that pass the full check: the token stream the dataset must read back.
  std::vector<std::string> paths;
  try {
    paths = dst::data::resolve_shard_paths(source);
  } catch (const DatasetError& e) {
    if (g_verbose) std::fprintf(stderr, "resolve refused: %s\n", e.what());
  }
  std::vector<dst::data::ShardHeader> headers;
  std::vector<std::uint64_t> stream;
  bool all_header_ok = !paths.empty(), all_full_ok = !paths.empty();
  for (const std::string& path : paths) {
    bool header_ok = false, full_ok = false;
    dst::data::ShardHeader header;
    try {
      header = dst::data::validate_shard(path, dst::data::ShardCheck::header);
      header_ok = true;
      const auto full = dst::data::validate_shard(path, dst::data::ShardCheck::full);
      full_ok = true;
      if (full.num_tokens != header.num_tokens || full.vocab_size != header.vocab_size)
        property_failed("the header and full checks disagree on the header");
    } catch (const DatasetError& e) {
      if (g_verbose) std::fprintf(stderr, "refused: %s\n", e.what());
    }
    check_no_open_ids("validate_shard");
    if (g_verbose)
      std::fprintf(stderr, "%s: header %d full %d\n", path.c_str(), header_ok, full_ok);
    all_header_ok = all_header_ok && header_ok;
    all_full_ok = all_full_ok && full_ok;
    if (header_ok) headers.push_back(header);
    if (full_ok) {
      dst::h5::Lock lock;
      const auto tokens = reference_check(header);
      stream.insert(stream.end(), tokens.begin(), tokens.end());
    }
  }
  bool agree = all_header_ok;
  if (agree) {
    try {
      dst::data::check_shards_agree(headers);
    } catch (const DatasetError& e) {
      if (g_verbose) std::fprintf(stderr, "disagree: %s\n", e.what());
      agree = false;
    }
  }
  const bool readable = all_full_ok && agree;  // every sample must read back exactly

  try {
    const dst::data::TokenDataset ds = dst::data::open_dataset(MPI_COMM_SELF, source, plan.seq_len);
    if (!all_header_ok || !agree)
      property_failed(
          "open_dataset accepted a dataset whose shards validate_shard refuses "
          "or that disagree");
    const std::uint64_t n = ds.num_samples();
    const auto T = static_cast<std::uint64_t>(plan.seq_len);
    if (n == 0 || n != (ds.num_tokens() - 1) / T) property_failed("num_samples");
    if (readable && ds.num_tokens() != stream.size())
      property_failed("num_tokens differs from the shards' total");
    const std::vector<std::uint64_t> ids = {0, plan.sample_pick % n, n - 1};
    dst::data::BatchReaderOptions options;
    options.prefetch = false;
    options.max_open_shards = 1;
    dst::data::BatchReader reader(ds, options);
    for (std::uint64_t id : ids) {
      reader.request({id});
      try {
        const dst::data::Batch b = reader.wait();
        if (b.rows() != 1 || b.tokens.size() != T + 1) property_failed("batch shape");
        if (readable)
          for (std::uint64_t k = 0; k <= T; ++k)
            if (static_cast<std::uint64_t>(b.tokens[k]) != stream[id * T + k])
              property_failed("sample " + std::to_string(id) + " reads back different tokens");
        if (g_verbose)
          std::fprintf(stderr, "read sample %llu\n", static_cast<unsigned long long>(id));
      } catch (const DatasetError& e) {
        if (g_verbose) std::fprintf(stderr, "read refused: %s\n", e.what());
        if (readable) property_failed("reading a fully validated dataset failed");
      }
    }
  } catch (const DatasetError& e) {
    if (g_verbose) std::fprintf(stderr, "open_dataset refused: %s\n", e.what());
  }
  check_no_open_ids("open_dataset and BatchReader");
  return 0;
}
