/// \file reader.cpp
/// Reader: the verified, collective load of a checkpoint (docs/checkpoint.md,
/// "loading").
#include <algorithm>
#include <chrono>
#include <limits>
#include <optional>
#include <sstream>

#include "ckpt/checkpoint.hpp"
#include "ckpt/detail/collectives.hpp"
#include "ckpt/detail/files.hpp"
#include "ckpt/detail/format.hpp"
#include "ckpt/detail/h5.hpp"
#include "ckpt/detail/partition.hpp"
#include "ckpt/detail/timing.hpp"
#include "ckpt/manifest.hpp"
#include "h5/lock.hpp"

namespace dst::ckpt {

using detail::Bounded;
using detail::capture;
using detail::Clock;
using detail::numel;
using detail::seconds_since;
using Kind = CheckpointError::Kind;

std::uint64_t element_count(const std::vector<std::int64_t>& shape) {
  return numel(shape);
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

namespace {

/// The element count of `dims`, or nullopt when the product overflows 64 bits.
std::optional<std::uint64_t> checked_numel(const std::vector<hsize_t>& dims) {
  std::uint64_t n = 1;
  for (const hsize_t d : dims) {
    if (d != 0 && n > std::numeric_limits<std::uint64_t>::max() / d) return std::nullopt;
    n *= d;
  }
  return n;
}

/// Rank 0's check before libhdf5 sees the file: the manifest exists, names this file,
/// and its size and whole-file xxh64 match. Returns the file size.
std::uint64_t check_manifest(const std::string& file) {
  const std::uint64_t size = detail::file_size(file);  // Kind::missing when absent
  const std::string mpath = manifest_path(file);
  const Manifest m = read_manifest(mpath);
  const auto bad = [&](const std::string& why) {
    throw CheckpointError(Kind::manifest, "checkpoint " + file + " does not match its manifest " +
                                              mpath + ": " + why +
                                              " (the file was changed, truncated or replaced "
                                              "after it was committed)");
  };
  if (m.file != detail::base_name(file)) bad("the manifest is for \"" + m.file + "\"");
  if (m.size != size)
    bad("size " + std::to_string(size) + " bytes, manifest says " + std::to_string(m.size));
  const std::uint64_t h = file_xxh64(file);
  if (h != m.xxh64) bad("xxh64 " + hex64(h) + ", manifest says " + hex64(m.xxh64));
  return size;
}

/// The text of the scalar fixed-length string dataset `name`.
std::string read_text(hid_t file, const char* name, hid_t dxpl, const std::string& where) {
  using namespace detail;
  h5::Handle dset(DST_CKPT_H5(H5Dopen2(file, name, H5P_DEFAULT), where));
  h5::Handle ftype(DST_CKPT_H5(H5Dget_type(dset.get()), where));
  if (H5Tget_class(ftype.get()) != H5T_STRING || H5Tis_variable_str(ftype.get()) > 0)
    throw CheckpointError(Kind::format,
                          where + ": /" + std::string(name) + " is not a fixed-length string");
  const std::size_t n = H5Tget_size(ftype.get());
  h5::Handle mtype(DST_CKPT_H5(H5Tcopy(H5T_C_S1), where));
  DST_CKPT_H5(H5Tset_size(mtype.get(), n), where);
  DST_CKPT_H5(H5Tset_strpad(mtype.get(), H5T_STR_NULLPAD), where);
  std::string text(n, '\0');
  DST_CKPT_H5(H5Dread(dset.get(), mtype.get(), H5S_ALL, H5S_ALL, dxpl, text.data()), where);
  const auto end = text.find('\0');
  if (end != std::string::npos) text.resize(end);
  return text;
}

void read_metadata(hid_t file, Metadata& m, hid_t dxpl, const std::string& where) {
  using namespace detail;
  m.format_version = static_cast<int>(read_attr_i64(file, "format_version", where));
  m.step = read_attr_i64(file, "step", where);
  m.epoch = read_attr_u64(file, "epoch", where);
  m.consumed = read_attr_u64(file, "consumed", where);
  m.samples_seen = read_attr_u64(file, "samples_seen", where);
  m.optimizer_steps = read_attr_i64(file, "optimizer_steps", where);
  m.skipped_steps = read_attr_i64(file, "skipped_steps", where);
  m.seed = read_attr_u64(file, "seed", where);
  m.rng = read_attr_str(file, "rng", where);
  m.loss_scale = read_attr_f64(file, "loss_scale", where);
  m.loss_scale_clean_steps = read_attr_i64(file, "loss_scale_clean_steps", where);
  m.software_version = read_attr_str(file, "software_version", where);
  m.tokenizer_name = read_attr_str(file, "tokenizer_name", where);
  m.created_utc = read_attr_str(file, "created_utc", where);
  m.world_size = read_attr_i64(file, "world_size", where);
  m.data_parallel = read_attr_i64(file, "data_parallel", where);
  m.tensor_parallel = read_attr_i64(file, "tensor_parallel", where);
  m.pipeline_parallel = read_attr_i64(file, "pipeline_parallel", where);
  m.global_batch_size = read_attr_i64(file, "global_batch_size", where);
  m.micro_batch_size = read_attr_i64(file, "micro_batch_size", where);
  m.grad_accum_steps = read_attr_i64(file, "grad_accum_steps", where);

  if (DST_CKPT_H5(H5Lexists(file, kMetaGroup, H5P_DEFAULT), where) <= 0 ||
      DST_CKPT_H5(H5Lexists(file, kDeckDataset, H5P_DEFAULT), where) <= 0)
    throw CheckpointError(Kind::format, where + ": dataset /" + std::string(kDeckDataset) +
                                            " (the run deck) is missing");
  m.deck_yaml = read_text(file, kDeckDataset, dxpl, where);
  if (DST_CKPT_H5(H5Lexists(file, kTokenizerJsonDataset, H5P_DEFAULT), where) > 0)
    m.tokenizer_json = read_text(file, kTokenizerJsonDataset, dxpl, where);
}

herr_t collect_link(hid_t, const char* name, const H5L_info_t*, void* out) {
  static_cast<std::vector<std::string>*>(out)->emplace_back(name);
  return 0;
}

/// Every dataset outside /meta, with its shape, type and stored checksum, by name.
std::vector<TensorInfo> list_tensors(hid_t file, const std::string& where) {
  hsize_t file_bytes = 0;
  DST_CKPT_H5(H5Fget_filesize(file, &file_bytes), where);
  std::vector<std::string> links;
  DST_CKPT_H5(H5Lvisit(file, H5_INDEX_NAME, H5_ITER_INC, collect_link, &links), where);
  std::sort(links.begin(), links.end());
  std::vector<TensorInfo> out;
  const std::string meta_prefix = std::string(detail::kMetaGroup) + "/";
  for (const auto& name : links) {
    if (name == detail::kMetaGroup || name.rfind(meta_prefix, 0) == 0) continue;
    const std::string w = where + " tensor " + name;
    h5::Handle obj(DST_CKPT_H5(H5Oopen(file, name.c_str(), H5P_DEFAULT), w));
    if (H5Iget_type(obj.get()) != H5I_DATASET) continue;  // a group on the way to tensors
    TensorInfo info;
    info.name = name;
    h5::Handle space(DST_CKPT_H5(H5Dget_space(obj.get()), w));
    const int rank = DST_CKPT_H5(H5Sget_simple_extent_ndims(space.get()), w);
    std::vector<hsize_t> dims(rank);
    DST_CKPT_H5(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr), w);
    info.shape.assign(dims.begin(), dims.end());
    h5::Handle type(DST_CKPT_H5(H5Dget_type(obj.get()), w));
    if (DST_CKPT_H5(H5Tequal(type.get(), H5T_IEEE_F32LE), w) > 0) {
      info.dtype = "f32";
      // Every byte a tensor claims must be stored: a dataset may not claim more than the
      // file holds (found by fuzz_checkpoint: a chunked dataset of extent 2^41 storing
      // nothing made verify_all() size its buffer at 8 TiB).
      const auto n = checked_numel(dims);
      const hsize_t stored = H5Dget_storage_size(obj.get());
      if (!n || *n > file_bytes / sizeof(float) || stored < *n * sizeof(float))
        throw CheckpointError(Kind::format, w + ": claims " + shape_text(info.shape) +
                                                " f32 elements but " + std::to_string(stored) +
                                                " bytes are stored (file of " +
                                                std::to_string(file_bytes) + " bytes)");
    } else {
      std::ostringstream os;
      os << "class " << static_cast<int>(H5Tget_class(type.get())) << ", "
         << H5Tget_size(type.get()) << " bytes";
      info.dtype = os.str();
    }
    info.checksum = detail::read_attr_u64(obj.get(), detail::kChecksumAttr, w);
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace

Reader::Reader(MPI_Comm comm, const std::string& file, double timeout_s, const IoOptions& io)
    : comm_(comm), path_(file), timeout_s_(timeout_s) {
  const auto t_start = Clock::now();
  Bounded bounded(comm_, timeout_s_, "checkpoint open " + path_);
  stats_.path = path_;

  // 1. The manifest, on rank 0, before libhdf5 parses a byte of the file.
  std::uint64_t figures[2] = {0, 0};  // size, hash time in ns
  if (bounded.rank() == 0) {
    bounded.agree(capture([&] {
      const auto t_hash = Clock::now();
      figures[0] = check_manifest(path_);
      figures[1] = static_cast<std::uint64_t>(seconds_since(t_hash) * 1e9);
    }));
  } else {
    bounded.agree(std::nullopt);
  }
  bounded.broadcast(figures, 2, MPI_UINT64_T, 0);
  stats_.bytes = figures[0];
  stats_.hash_seconds = static_cast<double>(figures[1]) * 1e-9;

  // 2. Open collectively; format, metadata, tensor list.
  bounded.agree(capture([&] {
    h5::Lock lock;
    h5::Handle fapl = detail::make_mpio_fapl(comm_, io, path_);
    h5::Handle f(DST_CKPT_H5(H5Fopen(path_.c_str(), H5F_ACC_RDONLY, fapl.get()), path_));
    const std::string format = detail::read_attr_str(f.get(), "format", path_);
    if (format != detail::kFormatName)
      throw CheckpointError(Kind::format, path_ + ": format is \"" + format + "\", not \"" +
                                              detail::kFormatName + "\"");
    const auto version = detail::read_attr_i64(f.get(), "format_version", path_);
    if (version != kFormatVersion)
      throw CheckpointError(Kind::format, path_ + ": checkpoint format version " +
                                              std::to_string(version) + ", this dstrain reads " +
                                              std::to_string(kFormatVersion) +
                                              " (docs/checkpoint.md)");
    h5::Handle dxpl(DST_CKPT_H5(H5Pcreate(H5P_DATASET_XFER), path_));
    DST_CKPT_H5(H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_COLLECTIVE), path_);
    read_metadata(f.get(), meta_, dxpl.get(), path_);
    tensors_ = list_tensors(f.get(), path_);
    file_ = f.release();
  }));
  stats_.total_seconds = seconds_since(t_start);
}

Reader::~Reader() {
  if (file_ < 0) return;
  h5::Lock lock;
  // Collective: every rank destroys its Reader. A close error of a read-only file loses
  // nothing, and a destructor cannot report it.
  if (H5Fclose(static_cast<hid_t>(file_)) < 0) H5Eclear2(H5E_DEFAULT);
}

const TensorInfo* Reader::find(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

std::uint64_t Reader::read_and_hash(const TensorInfo& info, float* out) {
  Bounded bounded(comm_, timeout_s_, "checkpoint read " + path_ + " tensor " + info.name);
  const int rank = bounded.rank(), size = bounded.size();
  const std::string where = path_ + " tensor " + info.name;
  const auto rs = detail::row_shape(info.shape);
  const std::uint64_t n = numel(info.shape);
  const auto t0 = Clock::now();
  if (n > 0) {
    // Every rank reads its rows in pieces; after each round of pieces, the pieces are
    // broadcast so every rank holds the whole tensor.
    std::vector<std::vector<detail::RowRange>> all(size);
    std::size_t calls = 0;
    for (int r = 0; r < size; ++r) {
      all[r] = detail::pieces(detail::read_rows(rs, r, size), rs, detail::kMaxPieceElements);
      calls = std::max(calls, all[r].size());
    }
    for (std::size_t k = 0; k < calls; ++k) {
      bool collective = true;
      bounded.agree(capture([&] {
        h5::Lock lock;
        h5::Handle dset(DST_CKPT_H5(
            H5Dopen2(static_cast<hid_t>(file_), info.name.c_str(), H5P_DEFAULT), where));
        h5::Handle fspace(DST_CKPT_H5(H5Dget_space(dset.get()), where));
        h5::Handle dxpl(DST_CKPT_H5(H5Pcreate(H5P_DATASET_XFER), where));
        DST_CKPT_H5(H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_COLLECTIVE), where);
        const bool active = k < all[rank].size();
        h5::Handle mspace = detail::select_piece(
            fspace.get(), info.shape, active ? &all[rank][k] : nullptr, rs.row_elements, where);
        float* buf = active ? out + all[rank][k].begin * rs.row_elements : out;
        DST_CKPT_H5(
            H5Dread(dset.get(), H5T_NATIVE_FLOAT, mspace.get(), fspace.get(), dxpl.get(), buf),
            where);
        H5D_mpio_actual_io_mode_t mode = H5D_MPIO_NO_COLLECTIVE;
        DST_CKPT_H5(H5Pget_mpio_actual_io_mode(dxpl.get(), &mode), where);
        collective = mode != H5D_MPIO_NO_COLLECTIVE;
        if (active) stats_.bytes_this_rank += all[rank][k].rows() * rs.row_elements * sizeof(float);
      }));
      if (!collective) all_collective_ = false;
      std::vector<std::uint64_t> offsets(size), counts(size);
      for (int r = 0; r < size; ++r)
        if (k < all[r].size()) {
          offsets[r] = all[r][k].begin * rs.row_elements;
          counts[r] = all[r][k].rows() * rs.row_elements;
        }
      bounded.exchange_pieces(out, offsets, counts, "exchange of tensor pieces (broadcast)");
    }
  }
  stats_.seconds += seconds_since(t0);
  // The checksum, shared like the save's: each rank hashes a share of the blocks.
  const std::uint64_t bytes = n * sizeof(float);
  const std::uint64_t blocks = (bytes + kChecksumBlockBytes - 1) / kChecksumBlockBytes;
  const auto share = detail::block_share(blocks, rank, size);
  std::vector<std::uint64_t> mine;
  for (std::uint64_t b = share.begin; b < share.end; ++b) {
    const std::uint64_t at = b * kChecksumBlockBytes;
    mine.push_back(block_digest(reinterpret_cast<const unsigned char*>(out) + at,
                                std::min(kChecksumBlockBytes, bytes - at)));
  }
  const std::uint64_t sum = combine_block_digests(bounded.allgather_u64(mine));
  stats_.collective = all_collective_;
  stats_.total_seconds += seconds_since(t0);
  return sum;
}

void Reader::read(const std::string& name, const std::vector<std::int64_t>& expected_shape,
                  float* out) {
  const TensorInfo* info = find(name);
  if (info == nullptr)
    throw CheckpointError(Kind::mismatch, "checkpoint " + path_ + " has no tensor " + name);
  if (info->shape != expected_shape)
    throw CheckpointError(Kind::mismatch, "checkpoint " + path_ + ": tensor " + name +
                                              " has shape " + shape_text(info->shape) +
                                              ", expected " + shape_text(expected_shape));
  if (info->dtype != "f32")
    throw CheckpointError(Kind::format, "checkpoint " + path_ + ": tensor " + name +
                                            " is stored as " + info->dtype + ", not f32");
  const std::uint64_t sum = read_and_hash(*info, out);
  if (sum != info->checksum)
    throw CheckpointError(Kind::checksum, "checkpoint " + path_ + ": tensor " + name +
                                              " fails its checksum: " + "stored " +
                                              hex64(info->checksum) + ", read " + hex64(sum) +
                                              " (the data was damaged after it was written)");
}

std::vector<std::string> Reader::verify_all() {
  std::uint64_t largest = 0;
  for (const auto& t : tensors_)  // f32 tensors: list_tensors checked they are stored
    if (t.dtype == "f32") largest = std::max(largest, numel(t.shape));
  std::vector<float> buf(largest);
  std::vector<std::string> bad;
  for (const auto& t : tensors_) {
    if (t.dtype != "f32" || read_and_hash(t, buf.data()) != t.checksum) bad.push_back(t.name);
  }
  return bad;
}

}  // namespace dst::ckpt
