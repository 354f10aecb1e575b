/// \file shard_writer.cpp
/// ShardWriter: extendible chunked datasets filled block by block, published by rename.
#include "data/dataset/shard_writer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "h5/attribute.hpp"
#include "h5/lock.hpp"

namespace dst::data {

namespace {

// Offsets per chunk of /doc_offsets: 4096 x 8 bytes = 32 KiB, small next to the tokens
// but large enough that a shard of a million documents has a few hundred chunks.
constexpr std::uint64_t kOffsetsChunk = 4096;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void write_uint_attr(hid_t loc, const char* name, std::uint64_t value, hid_t file_type,
                     const std::string& where) {
  h5::write_scalar_attribute(loc, name, file_type, H5T_NATIVE_UINT64, &value, where,
                             detail::raise_dataset_error);
}

// Variable-length UTF-8: h5py reads it as a Python str, h5dump prints it as text.
void write_string_attr(hid_t loc, const char* name, const std::string& value,
                       const std::string& where) {
  h5::write_variable_string_attribute(loc, name, value, where, detail::raise_dataset_error);
}

h5::Handle create_extendible(hid_t file, const char* name, hid_t file_type, std::uint64_t chunk,
                             const std::string& where) {
  const hsize_t dims[1] = {0};
  const hsize_t max_dims[1] = {H5S_UNLIMITED};
  const hsize_t chunk_dims[1] = {chunk};
  h5::Handle space(DST_H5_CHECK(H5Screate_simple(1, dims, max_dims), where));
  h5::Handle dcpl(DST_H5_CHECK(H5Pcreate(H5P_DATASET_CREATE), where));
  DST_H5_CHECK(H5Pset_chunk(dcpl.get(), 1, chunk_dims), where);
  return h5::Handle(DST_H5_CHECK(
      H5Dcreate2(file, name, file_type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT), where));
}

void fsync_path(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags);
  if (fd < 0 || ::fsync(fd) != 0) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    throw DatasetError("shard '" + path +
                       "': fsync before publishing failed: " + std::strerror(err));
  }
  ::close(fd);
}

}  // namespace

ShardWriter::ShardWriter(std::string path, ShardWriterOptions options)
    : path_(std::move(path)), tmp_path_(path_ + kShardTmpSuffix), options_(std::move(options)) {
  const std::string where = "shard writer '" + path_ + "'";
  if (!ends_with(path_, kShardSuffix))
    throw DatasetError(where + ": a shard's name must end in '" + kShardSuffix +
                       "' (readers select shards by it)");
  if (options_.vocab_size < 1 || options_.vocab_size > kMaxVocabSize)
    throw DatasetError(where + ": vocab_size " + std::to_string(options_.vocab_size) +
                       " is outside [1, " + std::to_string(kMaxVocabSize) + "]");
  if (options_.eos_id >= options_.vocab_size)
    throw DatasetError(where + ": eos_id " + std::to_string(options_.eos_id) +
                       " is outside the vocabulary of " + std::to_string(options_.vocab_size));
  if (options_.tokenizer.name.empty() || options_.tokenizer.hash.empty())
    throw DatasetError(where + ": the tokenizer's name and hash must both be given");
  if (options_.chunk_tokens < 1) throw DatasetError(where + ": chunk_tokens must be positive");

  h5::Lock lock;
  const std::string tmp_where = "shard '" + tmp_path_ + "'";
  file_ = h5::Handle(DST_H5_CHECK(
      H5Fcreate(tmp_path_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), tmp_where));
  const hid_t token_type =
      options_.vocab_size <= kMaxVocabForUint16 ? H5T_STD_U16LE : H5T_STD_U32LE;
  tokens_ =
      create_extendible(file_.get(), kTokensDataset, token_type, options_.chunk_tokens, tmp_where);
  offsets_ds_ =
      create_extendible(file_.get(), kOffsetsDataset, H5T_STD_U64LE, kOffsetsChunk, tmp_where);
  token_buf_.reserve(options_.chunk_tokens);
  offsets_.push_back(0);
}

ShardWriter::~ShardWriter() {
  if (closed_) return;
  {
    h5::Lock lock;
    tokens_.reset();
    offsets_ds_.reset();
    file_.reset();
  }
  std::remove(tmp_path_.c_str());
}

void ShardWriter::append_to(hid_t dataset, std::uint64_t at, const void* data, std::uint64_t count,
                            hid_t mem_type) {
  const std::string where = "shard '" + tmp_path_ + "'";
  const hsize_t new_size[1] = {at + count};
  DST_H5_CHECK(H5Dset_extent(dataset, new_size), where);
  h5::Handle file_space(DST_H5_CHECK(H5Dget_space(dataset), where));
  const hsize_t start[1] = {at};
  const hsize_t n[1] = {count};
  DST_H5_CHECK(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start, nullptr, n, nullptr),
               where);
  h5::Handle mem_space(DST_H5_CHECK(H5Screate_simple(1, n, nullptr), where));
  DST_H5_CHECK(H5Dwrite(dataset, mem_type, mem_space.get(), file_space.get(), H5P_DEFAULT, data),
               where);
}

void ShardWriter::flush_tokens() {
  if (token_buf_.empty()) return;
  // HDF5 converts the uint32 buffer to the file's uint16 when the vocabulary is small;
  // every id was checked against vocab_size, so nothing overflows.
  append_to(tokens_.get(), tokens_written_, token_buf_.data(), token_buf_.size(),
            H5T_NATIVE_UINT32);
  tokens_written_ += token_buf_.size();
  token_buf_.clear();
}

void ShardWriter::flush_offsets(bool all) {
  if (offsets_.empty() || (!all && offsets_.size() < kOffsetsChunk)) return;
  append_to(offsets_ds_.get(), offsets_written_, offsets_.data(), offsets_.size(),
            H5T_NATIVE_UINT64);
  offsets_written_ += offsets_.size();
  offsets_.clear();
}

void ShardWriter::append_document(const std::int32_t* tokens, std::size_t count) {
  if (closed_) throw DatasetError("shard writer '" + path_ + "': append after close()");
  for (std::size_t k = 0; k < count; ++k) {
    if (tokens[k] < 0 || static_cast<std::uint64_t>(tokens[k]) >= options_.vocab_size)
      throw DatasetError("shard writer '" + path_ + "': document " +
                         std::to_string(num_documents()) + " has token id " +
                         std::to_string(tokens[k]) + " at position " + std::to_string(k) +
                         ", outside the vocabulary of " + std::to_string(options_.vocab_size));
  }
  h5::Lock lock;
  std::size_t k = 0;
  while (k <= count) {  // <= : the EOS after the document is the (count+1)-th token
    if (k == count) {
      token_buf_.push_back(static_cast<std::uint32_t>(options_.eos_id));
    } else {
      token_buf_.push_back(static_cast<std::uint32_t>(tokens[k]));
    }
    ++k;
    if (token_buf_.size() == options_.chunk_tokens) flush_tokens();
  }
  num_tokens_ += count + 1;
  offsets_.push_back(num_tokens_);
  flush_offsets(false);
}

ShardHeader ShardWriter::close() {
  if (closed_) throw DatasetError("shard writer '" + path_ + "': close() called twice");
  const std::string where = "shard '" + tmp_path_ + "'";
  ShardHeader h;
  h.path = path_;
  h.format_version = kShardFormatVersion;
  h.vocab_size = options_.vocab_size;
  h.eos_id = options_.eos_id;
  h.tokenizer = options_.tokenizer;
  h.num_tokens = num_tokens_;
  h.num_documents = num_documents();
  h.token_bytes = options_.vocab_size <= kMaxVocabForUint16 ? 2 : 4;
  {
    h5::Lock lock;
    flush_tokens();
    flush_offsets(true);
    const hid_t f = file_.get();
    write_string_attr(f, "format", kShardFormatName, where);
    write_uint_attr(f, "format_version", h.format_version, H5T_STD_U32LE, where);
    write_uint_attr(f, "vocab_size", h.vocab_size, H5T_STD_U64LE, where);
    write_uint_attr(f, "eos_id", h.eos_id, H5T_STD_U64LE, where);
    write_string_attr(f, "tokenizer_name", h.tokenizer.name, where);
    write_string_attr(f, "tokenizer_hash", h.tokenizer.hash, where);
    write_uint_attr(f, "num_tokens", h.num_tokens, H5T_STD_U64LE, where);
    write_uint_attr(f, "num_documents", h.num_documents, H5T_STD_U64LE, where);
    tokens_.close_checked(where, detail::raise_dataset_error);
    offsets_ds_.close_checked(where, detail::raise_dataset_error);
    file_.close_checked(where, detail::raise_dataset_error);
  }
  // The data must be on disk before the name says the shard is complete; the directory
  // is synced after the rename so the new name survives a crash too.
  fsync_path(tmp_path_, O_RDONLY);
  if (std::rename(tmp_path_.c_str(), path_.c_str()) != 0)
    throw DatasetError("shard '" + path_ + "': renaming '" + tmp_path_ +
                       "' failed: " + std::strerror(errno));
  closed_ = true;
  const std::filesystem::path parent = std::filesystem::path(path_).parent_path();
  fsync_path(parent.empty() ? std::string(".") : parent.string(), O_RDONLY | O_DIRECTORY);
  return h;
}

}  // namespace dst::data
