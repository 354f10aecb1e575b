/// \file directory.cpp
/// Directory: the collective write of a checkpoint and its atomic commit
/// (docs/checkpoint.md, "commit protocol").
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

#include "ckpt/checkpoint.hpp"
#include "ckpt/detail/collectives.hpp"
#include "ckpt/detail/files.hpp"
#include "ckpt/detail/format.hpp"
#include "ckpt/detail/h5.hpp"
#include "ckpt/detail/partition.hpp"
#include "ckpt/detail/timing.hpp"
#include "ckpt/manifest.hpp"
#include "core/exit_codes.hpp"
#include "core/log.hpp"
#include "h5/lock.hpp"

namespace dst::ckpt {

namespace fs = std::filesystem;
using detail::Bounded;
using detail::capture;
using detail::Clock;
using detail::numel;
using detail::seconds_since;
using Kind = CheckpointError::Kind;

namespace {

/// What a caller could get wrong, checked before anything touches the disk.
void validate(const Metadata& meta, const std::vector<TensorRef>& tensors, const std::string& file,
              bool need_data = true) {
  const auto bad = [&](const std::string& why) {
    throw CheckpointError(Kind::io, "checkpoint save " + file + ": " + why);
  };
  if (meta.step < 0) bad("negative step " + std::to_string(meta.step));
  std::set<std::string> names;
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name.front() == '/' || t.name.back() == '/' ||
        t.name.find("//") != std::string::npos)
      bad("tensor name \"" + t.name + "\" is not a relative HDF5 path");
    if (t.name == detail::kMetaGroup || t.name.rfind(std::string(detail::kMetaGroup) + "/", 0) == 0)
      bad("tensor name \"" + t.name + "\" is under the reserved group /meta");
    if (!names.insert(t.name).second) bad("tensor \"" + t.name + "\" is given twice");
    for (auto d : t.shape)
      if (d < 0) bad("tensor " + t.name + " has a negative dimension");
    if (need_data && numel(t.shape) > 0 && t.data == nullptr)
      bad("tensor " + t.name + " has no data");
  }
}

/// Refuses a save whose file would outgrow this process's file-size limit (`ulimit -f`,
/// RLIMIT_FSIZE): the write would fail part-way, and HDF5 1.10 cannot then close the
/// partial file (it extends it to its allocated size), which crashes MPI_Finalize later.
/// The estimate: the tensors' bytes, the deck and tokenizer texts, and 4 KiB of object
/// headers per tensor plus 1 MiB for the rest of the file's metadata.
void check_file_size_limit(const Metadata& meta, const std::vector<TensorRef>& tensors,
                           const std::string& file) {
  rlimit limit{};
  if (getrlimit(RLIMIT_FSIZE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return;
  std::uint64_t bytes = meta.deck_yaml.size() + meta.tokenizer_json.size() + (1u << 20);
  for (const auto& t : tensors)
    bytes += numel(t.shape) * sizeof(float) + 4096;
  if (bytes <= limit.rlim_cur) return;
  throw CheckpointError(
      Kind::io, "checkpoint save " + file + ": the file would hold about " +
                    std::to_string(bytes >> 20) + " MiB, over this process's file-size limit of " +
                    std::to_string(limit.rlim_cur >> 20) + " MiB (ulimit -f; RLIMIT_FSIZE)");
}

/// The checksum of one tensor of `elements` floats at `data` (identical on every rank):
/// each rank hashes an equal share of its blocks; the digests are gathered and combined.
std::uint64_t checksum(const float* data, std::uint64_t elements, Bounded& comm) {
  const std::uint64_t bytes = elements * sizeof(float);
  const std::uint64_t blocks = (bytes + kChecksumBlockBytes - 1) / kChecksumBlockBytes;
  const auto share = detail::block_share(blocks, comm.rank(), comm.size());
  std::vector<std::uint64_t> mine;
  mine.reserve(share.rows());
  const auto* p = reinterpret_cast<const unsigned char*>(data);
  for (std::uint64_t g = share.begin; g < share.end; ++g) {
    const std::uint64_t at = g * kChecksumBlockBytes;
    mine.push_back(block_digest(p + at, std::min(kChecksumBlockBytes, bytes - at)));
  }
  return combine_block_digests(comm.allgather_u64(mine));
}

/// The checksums of all tensors: the blocks of all tensors are listed in order and each
/// rank hashes an equal share of the list; the digests are gathered, and every rank
/// combines each tensor's digests.
std::vector<std::uint64_t> checksums(const std::vector<TensorRef>& tensors, Bounded& comm) {
  std::vector<std::uint64_t> first_block(tensors.size() + 1, 0);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::uint64_t bytes = numel(tensors[i].shape) * sizeof(float);
    first_block[i + 1] = first_block[i] + (bytes + kChecksumBlockBytes - 1) / kChecksumBlockBytes;
  }
  const auto share = detail::block_share(first_block.back(), comm.rank(), comm.size());
  std::vector<std::uint64_t> mine;
  mine.reserve(share.rows());
  std::size_t t = 0;
  for (std::uint64_t g = share.begin; g < share.end; ++g) {
    while (first_block[t + 1] <= g)
      ++t;
    const std::uint64_t bytes = numel(tensors[t].shape) * sizeof(float);
    const std::uint64_t at = (g - first_block[t]) * kChecksumBlockBytes;
    const auto* p = reinterpret_cast<const unsigned char*>(tensors[t].data);
    mine.push_back(block_digest(p + at, std::min(kChecksumBlockBytes, bytes - at)));
  }
  const std::vector<std::uint64_t> all = comm.allgather_u64(mine);
  std::vector<std::uint64_t> out(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i)
    out[i] = combine_block_digests(
        std::vector<std::uint64_t>(all.begin() + first_block[i], all.begin() + first_block[i + 1]));
  return out;
}

/// A scalar fixed-length string dataset `name` holding `text`, written by rank 0.
void write_text(hid_t file, const char* name, const std::string& text, int rank, hid_t dxpl,
                const std::string& where) {
  using namespace detail;
  const std::string value = text.empty() ? std::string(1, '\0') : text;
  h5::Handle type(DST_CKPT_H5(H5Tcopy(H5T_C_S1), where));
  DST_CKPT_H5(H5Tset_size(type.get(), value.size()), where);
  DST_CKPT_H5(H5Tset_strpad(type.get(), H5T_STR_NULLPAD), where);
  h5::Handle space(DST_CKPT_H5(H5Screate(H5S_SCALAR), where));
  h5::Handle dset(DST_CKPT_H5(
      H5Dcreate2(file, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
      where + " /" + name));
  h5::Handle sel(DST_CKPT_H5(H5Screate(H5S_SCALAR), where));
  if (rank != 0) DST_CKPT_H5(H5Sselect_none(sel.get()), where);
  DST_CKPT_H5(H5Dwrite(dset.get(), type.get(), sel.get(), sel.get(), dxpl, value.data()),
              where + " /" + name);
}

void write_metadata(hid_t file, const Metadata& m, int rank, hid_t dxpl, const std::string& where) {
  using namespace detail;
  write_attr_str(file, "format", kFormatName, where);
  write_attr_i64(file, "format_version", kFormatVersion, where);
  write_attr_i64(file, "step", m.step, where);
  write_attr_u64(file, "epoch", m.epoch, where);
  write_attr_u64(file, "consumed", m.consumed, where);
  write_attr_u64(file, "samples_seen", m.samples_seen, where);
  write_attr_i64(file, "optimizer_steps", m.optimizer_steps, where);
  write_attr_i64(file, "skipped_steps", m.skipped_steps, where);
  write_attr_u64(file, "seed", m.seed, where);
  write_attr_str(file, "rng", m.rng, where);
  write_attr_f64(file, "loss_scale", m.loss_scale, where);
  write_attr_i64(file, "loss_scale_clean_steps", m.loss_scale_clean_steps, where);
  write_attr_str(file, "software_version", m.software_version, where);
  write_attr_str(file, "tokenizer_name", m.tokenizer_name, where);
  write_attr_str(file, "created_utc", m.created_utc, where);
  write_attr_i64(file, "world_size", m.world_size, where);
  write_attr_i64(file, "data_parallel", m.data_parallel, where);
  write_attr_i64(file, "tensor_parallel", m.tensor_parallel, where);
  write_attr_i64(file, "pipeline_parallel", m.pipeline_parallel, where);
  write_attr_i64(file, "global_batch_size", m.global_batch_size, where);
  write_attr_i64(file, "micro_batch_size", m.micro_batch_size, where);
  write_attr_i64(file, "grad_accum_steps", m.grad_accum_steps, where);

  // The deck and the tokenizer may outgrow an attribute (64 KiB in HDF5's default object
  // header), so they are datasets: scalar fixed-length strings, written by rank 0 (the
  // others select none). The tokenizer's JSON is stored only when the run has one.
  h5::Handle group(
      DST_CKPT_H5(H5Gcreate2(file, kMetaGroup, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), where));
  write_text(file, kDeckDataset, m.deck_yaml, rank, dxpl, where);
  if (!m.tokenizer_json.empty())
    write_text(file, kTokenizerJsonDataset, m.tokenizer_json, rank, dxpl, where);
}

struct WriteResult {
  std::uint64_t bytes_this_rank = 0;
  bool collective = true;
};

/// Creates `tmp` collectively and writes everything into it; every rank calls every
/// HDF5 function (collective metadata), and every H5Dwrite, with an empty selection
/// where it has nothing to write.
/// The data of tensor `i` comes from `source(i)` (called in order, collectively), its
/// checksum from `sum(i, data)` (after the data, before the dataset is created).
///
/// A write can fail on some ranks only: in a collective write the aggregators write, and
/// only the one that met a full disk or a quota sees the error. The others would go on
/// into the next tensor's collectives while it closes the file, and both would wait there
/// until the deadline. So the work comes in steps (the file's creation, each tensor's
/// dataset, each piece written, each close), each ending in an agreement; after a failure
/// every rank throws the same agreed error at the same point, and unwinding closes the
/// same handles in the same order everywhere. What this throws, every rank throws.
WriteResult write_file(Bounded& comm, MPI_Comm comm_mpi, const IoOptions& io,
                       const std::string& tmp, const Metadata& meta,
                       const std::vector<TensorRef>& tensors,
                       const std::function<const float*(std::size_t)>& source,
                       const std::function<std::uint64_t(std::size_t, const float*)>& sum,
                       SaveFaults faults) {
  const auto step = [&](auto&& f) {
    if (auto e = comm.agreed(capture(f))) throw *e;
  };
  const int rank = comm.rank();
  const int size = comm.size();
  h5::Lock lock;
  WriteResult result;
  h5::Handle fapl, file, dxpl, lcpl, dcpl;
  step([&] {
    fapl = detail::make_mpio_fapl(comm_mpi, io, tmp);
    file = h5::Handle(
        DST_CKPT_H5(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), tmp));
    dxpl = h5::Handle(DST_CKPT_H5(H5Pcreate(H5P_DATASET_XFER), tmp));
    DST_CKPT_H5(H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_COLLECTIVE), tmp);
    write_metadata(file.get(), meta, rank, dxpl.get(), tmp);

    lcpl = h5::Handle(DST_CKPT_H5(H5Pcreate(H5P_LINK_CREATE), tmp));
    DST_CKPT_H5(H5Pset_create_intermediate_group(lcpl.get(), 1), tmp);
    dcpl = h5::Handle(DST_CKPT_H5(H5Pcreate(H5P_DATASET_CREATE), tmp));
    DST_CKPT_H5(H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS), tmp);
    // Space is allocated at creation and never filled: every byte is written by us, and a
    // fill would write the whole file twice.
    DST_CKPT_H5(H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY), tmp);
    DST_CKPT_H5(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER), tmp);
  });

  std::uint64_t total = 0;
  for (const auto& t : tensors)
    total += numel(t.shape);
  std::uint64_t offset = 0;
  const std::size_t exit_after = std::max<std::size_t>(1, tensors.size() / 2);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorRef& t = tensors[i];
    const std::string where = tmp + " tensor " + t.name;
    const std::uint64_t n = numel(t.shape);
    const float* data = nullptr;
    std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
    h5::Handle fspace, dset;
    step([&] {
      data = source(i);
      if (n > 0 && data == nullptr)
        throw CheckpointError(Kind::io,
                              "checkpoint save " + tmp + ": tensor " + t.name + " has no data");
      const std::uint64_t checksum_i = sum(i, data);
      fspace = h5::Handle(DST_CKPT_H5(
          t.shape.empty() ? H5Screate(H5S_SCALAR)
                          : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
          where));
      dset = h5::Handle(DST_CKPT_H5(H5Dcreate2(file.get(), t.name.c_str(), H5T_IEEE_F32LE,
                                               fspace.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT),
                                    where));
      detail::write_attr_u64(dset.get(), detail::kChecksumAttr, checksum_i, where);
    });
    if (n > 0) {
      const auto rs = detail::row_shape(t.shape);
      std::size_t calls = 0;
      for (int r = 0; r < size; ++r)
        calls = std::max(calls, detail::pieces(detail::write_rows(offset, rs, total, r, size), rs,
                                               detail::kMaxPieceElements)
                                    .size());
      const auto mine = detail::pieces(detail::write_rows(offset, rs, total, rank, size), rs,
                                       detail::kMaxPieceElements);
      for (std::size_t k = 0; k < calls; ++k) {
        step([&] {
          const bool active = k < mine.size();
          h5::Handle mspace = detail::select_piece(
              fspace.get(), t.shape, active ? &mine[k] : nullptr, rs.row_elements, where);
          const float* buf = active ? data + mine[k].begin * rs.row_elements : data;
          DST_CKPT_H5(
              H5Dwrite(dset.get(), H5T_NATIVE_FLOAT, mspace.get(), fspace.get(), dxpl.get(), buf),
              where);
          H5D_mpio_actual_io_mode_t mode = H5D_MPIO_NO_COLLECTIVE;
          DST_CKPT_H5(H5Pget_mpio_actual_io_mode(dxpl.get(), &mode), where);
          if (mode == H5D_MPIO_NO_COLLECTIVE) result.collective = false;
          if (active) result.bytes_this_rank += mine[k].rows() * rs.row_elements * sizeof(float);
        });
      }
    }
    step([&] { dset.close_checked(where, detail::raise_checkpoint_error); });
    offset += n;
    if (faults.exit_rank == rank && i + 1 == exit_after) {
      log::error("checkpoint save " + tmp + ": debug fault injection: rank " +
                 std::to_string(rank) + " exits after " + std::to_string(i + 1) + " of " +
                 std::to_string(tensors.size()) + " tensors");
      ::_exit(kExitInjected);
    }
  }
  step([&] { file.close_checked(tmp, detail::raise_checkpoint_error); });
  return result;
}

/// Files of the commit this rank-0 step made, undone in reverse on failure.
struct CommitUndo {
  std::string tmp, final_path, manifest;
  bool renamed = false, manifest_written = false;
  void undo() const noexcept {
    std::error_code ec;
    if (manifest_written) fs::remove(manifest, ec);
    if (renamed) fs::remove(final_path, ec);
    fs::remove(tmp, ec);
  }
};

/// Removes committed checkpoints beyond the `keep_last` newest (never `keep`): the
/// manifest first, which un-commits the file, then the file.
void prune(const std::vector<std::string>& committed, std::int64_t keep_last,
           const std::string& keep) {
  std::int64_t kept = 0;
  for (const auto& p : committed) {
    if (kept < keep_last || p == keep) {
      ++kept;
      continue;
    }
    std::error_code ec;
    fs::remove(manifest_path(p), ec);
    if (!ec) fs::remove(p, ec);
    if (ec)
      log::warn("checkpoint: could not prune " + p + ": " + ec.message());
    else
      log::info("checkpoint: pruned " + p + " (keep_last " + std::to_string(keep_last) + ")");
  }
}

}  // namespace

Directory::Directory(MPI_Comm comm, std::string path, double timeout_s)
    : comm_(comm), path_(std::move(path)), timeout_s_(timeout_s) {}

int Directory::clean_leftovers() {
  Bounded comm(comm_, timeout_s_, "checkpoint clean_leftovers " + path_);
  std::uint64_t removed = 0;
  std::optional<CheckpointError> err;
  if (comm.rank() == 0) {
    err = capture([&] {
      fs::create_directories(path_);
      for (const auto& entry : fs::directory_iterator(path_)) {
        const std::string name = entry.path().filename().string();
        const bool ours_tmp =
            name == "latest.tmp" || (name.rfind("step-", 0) == 0 && name.size() > 4 &&
                                     name.compare(name.size() - 4, 4, ".tmp") == 0);
        if (!ours_tmp) continue;
        log::warn("checkpoint: removing " + entry.path().string() +
                  ", left behind by an interrupted save");
        fs::remove(entry.path());
        ++removed;
      }
      if (removed > 0) detail::fsync_dir(path_);
    });
  }
  comm.agree(err);
  comm.broadcast(&removed, 1, MPI_UINT64_T, 0);
  return static_cast<int>(removed);
}

IoStats Directory::save(Metadata meta, const std::vector<TensorRef>& tensors,
                        std::int64_t keep_last, SaveFaults faults) {
  return save_impl(std::move(meta), tensors, nullptr, keep_last, faults);
}

IoStats Directory::save(Metadata meta, const std::vector<TensorRef>& tensors,
                        const TensorSource& source, std::int64_t keep_last, SaveFaults faults) {
  if (!source)
    throw CheckpointError(Kind::io, "checkpoint save: a streamed save needs a tensor source");
  return save_impl(std::move(meta), tensors, &source, keep_last, faults);
}

IoStats Directory::save_impl(Metadata meta, const std::vector<TensorRef>& tensors,
                             const TensorSource* source, std::int64_t keep_last,
                             SaveFaults faults) {
  const auto t_start = Clock::now();
  const std::string final_path = path_ + "/" + detail::checkpoint_name(meta.step);
  const std::string tmp = final_path + ".tmp";
  Bounded comm(comm_, timeout_s_, "checkpoint save " + final_path);
  IoStats stats;
  stats.path = final_path;

  // Checked on every rank, then agreed: the tensors should be identical everywhere, but
  // a caller's bug on one rank must not leave the others inside HDF5 collectives.
  comm.agree(capture([&] {
    validate(meta, tensors, final_path, source == nullptr);
    check_file_size_limit(meta, tensors, final_path);
  }));
  std::string created = comm.rank() == 0 ? detail::utc_now() : std::string();
  comm.agree(comm.rank() == 0 ? capture([&] { fs::create_directories(path_); }) : std::nullopt);
  // Every rank must write identical metadata: rank 0's clock decides.
  comm.broadcast(created, 0);
  meta.created_utc = created;
  meta.format_version = kFormatVersion;

  // Whole tensors given: their checksums first, the blocks of all of them shared by the
  // ranks. Streamed: each tensor's when its source has produced it.
  const std::vector<std::uint64_t> sums =
      source ? std::vector<std::uint64_t>() : checksums(tensors, comm);
  const auto data_of = [&](std::size_t i) { return source ? (*source)(i) : tensors[i].data; };
  const auto sum_of = [&](std::size_t i, const float* data) {
    return source ? checksum(data, numel(tensors[i].shape), comm) : sums[i];
  };

  const auto t_write = Clock::now();
  WriteResult written;
  // write_file agrees on its errors itself: every rank holds the same one.
  auto err = capture(
      [&] { written = write_file(comm, comm_, io_, tmp, meta, tensors, data_of, sum_of, faults); });
  if (err) {
    if (comm.rank() == 0) CommitUndo{tmp, final_path, manifest_path(final_path)}.undo();
    // HDF5 says only "file write failed"; a full disk or quota is the usual cause. The
    // space left once the partial file is gone (the same figure on every rank: rank 0's).
    std::uint64_t space[2] = {0, 0};
    if (comm.rank() == 0) {
      std::error_code ec;
      const fs::space_info si = fs::space(path_, ec);
      if (!ec) space[0] = si.available, space[1] = si.capacity;
    }
    comm.broadcast(space, 2, MPI_UINT64_T, 0);
    if (space[1] == 0) throw *err;
    const auto mb = [](std::uint64_t bytes) {
      char text[32];
      std::snprintf(text, sizeof text, "%.1f MB", static_cast<double>(bytes) / 1e6);
      return std::string(text);
    };
    throw CheckpointError(err->kind(), err->what() + std::string(" (the file system of ") + path_ +
                                           " has " + mb(space[0]) + " free of " + mb(space[1]) +
                                           ", the partial file removed)");
  }
  double write_s = seconds_since(t_write);
  comm.allreduce(&write_s, 1, MPI_DOUBLE, MPI_MAX);
  std::uint64_t collective = written.collective ? 1 : 0;
  comm.allreduce(&collective, 1, MPI_UINT64_T, MPI_MIN);

  // Commit, on rank 0 (docs/checkpoint.md, "commit protocol"). [fsync s, hash s, size].
  double commit_figures[3] = {0, 0, 0};
  std::uint64_t file_bytes = 0;
  if (comm.rank() == 0) {
    CommitUndo undo{tmp, final_path, manifest_path(final_path)};
    err = capture([&] {
      const auto t_sync = Clock::now();
      detail::fsync_file(tmp);
      commit_figures[0] = seconds_since(t_sync);
      const auto t_hash = Clock::now();
      const Manifest m = describe_file(tmp, meta.step, created);
      commit_figures[1] = seconds_since(t_hash);
      file_bytes = m.size;
      // A manifest left from an earlier save of this step would vouch for nothing once the
      // file is replaced: un-commit the old file before the rename replaces it.
      fs::remove(undo.manifest);
      detail::rename_file(tmp, final_path);
      undo.renamed = true;
      detail::fsync_dir(path_);
      Manifest named = m;
      named.file = detail::base_name(final_path);
      undo.manifest_written = true;
      write_manifest(undo.manifest, named);
      detail::write_file_atomic(path_ + "/latest", named.file + "\n");
    });
    if (err) undo.undo();
  }
  comm.agree(err);
  if (comm.rank() == 0 && keep_last > 0) prune(committed(), keep_last, final_path);
  comm.allreduce(commit_figures, 3, MPI_DOUBLE, MPI_MAX);  // rank 0's figures; others hold 0
  comm.allreduce(&file_bytes, 1, MPI_UINT64_T, MPI_MAX);

  stats.bytes = file_bytes;
  stats.bytes_this_rank = written.bytes_this_rank;
  stats.seconds = write_s + commit_figures[0];
  stats.hash_seconds = commit_figures[1];
  stats.collective = collective != 0;
  stats.total_seconds = seconds_since(t_start);
  return stats;
}

std::vector<std::string> Directory::committed() const {
  std::vector<std::pair<std::int64_t, std::string>> found;
  std::error_code ec;
  for (fs::directory_iterator it(path_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const auto step = detail::parse_checkpoint_name(name);
    if (!step) continue;
    const std::string p = path_ + "/" + name;
    if (fs::exists(manifest_path(p), ec)) found.emplace_back(*step, p);
  }
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> out;
  for (auto& f : found)
    out.push_back(std::move(f.second));
  return out;
}

std::string Directory::latest() const {
  std::ifstream in(path_ + "/latest");
  std::string name;
  if (!in || !std::getline(in, name)) return "";
  while (!name.empty() && (name.back() == '\r' || name.back() == ' '))
    name.pop_back();
  return name.empty() ? "" : path_ + "/" + name;
}

}  // namespace dst::ckpt
