/// \file shard_format.cpp
/// validate_shard and friends: every check names the file and what is wrong, and every
/// read from the file is bounded by sizes checked before it (a hostile file must give an
/// error, never a crash or a huge allocation).
#include "data/dataset/shard_format.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <sstream>

#include "core/rng.hpp"
#include "data/dataset/detail/h5.hpp"
#include "h5/attribute.hpp"
#include "h5/handle.hpp"
#include "h5/lock.hpp"

namespace dst::data {

namespace {

// Tokens are scanned in blocks of this many (4 MiB as int32) by ShardCheck::full.
constexpr std::uint64_t kScanBlock = std::uint64_t{1} << 20;
// Longest string attribute accepted: tokenizer names and hashes are short; a larger one
// is a corrupt or hostile file.
constexpr std::size_t kMaxStringAttr = 4096;

std::string shard_where(const std::string& path) {
  return "shard '" + path + "'";
}

[[noreturn]] void fail(const std::string& path, const std::string& problem) {
  throw DatasetError(shard_where(path) + ": " + problem);
}

h5::Handle open_attribute(hid_t loc, const char* name, const std::string& path) {
  const std::string where = shard_where(path);
  if (!h5::has_attribute(loc, name, where, detail::raise_dataset_error))
    fail(path, std::string("attribute '") + name + "' is missing");
  hssize_t points = 0;
  h5::Handle attr = h5::open_attribute(loc, name, points, where, detail::raise_dataset_error);
  if (points != 1) fail(path, std::string("attribute '") + name + "' must hold one value");
  return attr;
}

std::int64_t read_int_attr(hid_t loc, const char* name, const std::string& path) {
  const std::string where = shard_where(path);
  h5::Handle attr = open_attribute(loc, name, path);
  h5::Handle type(DST_H5_CHECK(H5Aget_type(attr.get()), where));
  if (DST_H5_CHECK(H5Tget_class(type.get()), where) != H5T_INTEGER)
    fail(path, std::string("attribute '") + name + "' must be an integer");
  std::int64_t value = 0;
  DST_H5_CHECK(H5Aread(attr.get(), H5T_NATIVE_INT64, &value), where);
  if (value < 0)
    fail(path, std::string("attribute '") + name + "' must not be negative, got " +
                   std::to_string(value));
  return value;
}

std::string read_string_attr(hid_t loc, const char* name, const std::string& path) {
  const std::string where = shard_where(path);
  h5::Handle attr = open_attribute(loc, name, path);
  h5::Handle type(DST_H5_CHECK(H5Aget_type(attr.get()), where));
  if (DST_H5_CHECK(H5Tget_class(type.get()), where) != H5T_STRING)
    fail(path, std::string("attribute '") + name + "' must be a string");
  bool too_long = false;
  const std::string value = h5::read_string_attribute(attr.get(), type.get(), kMaxStringAttr,
                                                      too_long, where, detail::raise_dataset_error);
  if (too_long)
    fail(path, std::string("attribute '") + name + "' has an implausible length " +
                   std::to_string(H5Tget_size(type.get())));
  if (value.size() > kMaxStringAttr)
    fail(path, std::string("attribute '") + name + "' is longer than " +
                   std::to_string(kMaxStringAttr) + " bytes");
  return value;
}

struct DatasetShape {
  h5::Handle dataset;
  H5T_sign_t sign = H5T_SGN_ERROR;
  std::size_t bytes = 0;
  std::uint64_t length = 0;
};

// Opens a 1-D integer dataset and reports its element type and length.
DatasetShape open_1d_integer(hid_t file, const char* name, const std::string& path) {
  const std::string where = shard_where(path);
  if (DST_H5_CHECK(H5Lexists(file, name, H5P_DEFAULT), where) == 0)
    fail(path, std::string("dataset '") + name + "' is missing");
  DatasetShape s;
  s.dataset = h5::Handle(DST_H5_CHECK(H5Dopen2(file, name, H5P_DEFAULT), where));
  h5::Handle type(DST_H5_CHECK(H5Dget_type(s.dataset.get()), where));
  if (DST_H5_CHECK(H5Tget_class(type.get()), where) != H5T_INTEGER)
    fail(path, std::string("dataset '") + name + "' must hold integers");
  s.sign = DST_H5_CHECK(H5Tget_sign(type.get()), where);
  s.bytes = H5Tget_size(type.get());
  if (s.bytes == 0) fail(path, std::string("dataset '") + name + "' has an unreadable type");
  h5::Handle space(DST_H5_CHECK(H5Dget_space(s.dataset.get()), where));
  if (DST_H5_CHECK(H5Sget_simple_extent_ndims(space.get()), where) != 1)
    fail(path, std::string("dataset '") + name + "' must be one-dimensional");
  hsize_t dims[1] = {0};
  DST_H5_CHECK(H5Sget_simple_extent_dims(space.get(), dims, nullptr), where);
  s.length = dims[0];
  return s;
}

// A hostile header can claim 2^60 elements in a chunked dataset that stores nothing;
// everything sized from the header must be backed by data in the file first.
void check_stored(const DatasetShape& s, const char* name, const std::string& path) {
  const hsize_t stored = H5Dget_storage_size(s.dataset.get());
  if (s.length > 0 && stored / s.bytes < s.length)
    fail(path, std::string("dataset '") + name + "' stores " + std::to_string(stored) +
                   " bytes, less than its " + std::to_string(s.length) + " x " +
                   std::to_string(s.bytes) + " bytes (unwritten, truncated or compressed)");
}

void check_offsets_and_tokens(const ShardHeader& h, hid_t offsets_ds, hid_t tokens_ds) {
  const std::string where = shard_where(h.path);
  // (num_documents + 1,): sizes were checked against the attributes already, and the
  // attributes against the datasets, so this allocation is bounded by the file's size.
  std::vector<std::uint64_t> off(h.num_documents + 1);
  DST_H5_CHECK(H5Dread(offsets_ds, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, off.data()),
               where);
  if (off.front() != 0)
    fail(h.path, "doc_offsets[0] is " + std::to_string(off.front()) + ", must be 0");
  for (std::size_t d = 1; d < off.size(); ++d) {
    if (off[d] <= off[d - 1])
      fail(h.path, "doc_offsets is not strictly increasing at index " + std::to_string(d) + " (" +
                       std::to_string(off[d - 1]) + " then " + std::to_string(off[d]) + ")");
    if (off[d] > h.num_tokens)
      fail(h.path, "doc_offsets[" + std::to_string(d) + "] = " + std::to_string(off[d]) +
                       " is beyond num_tokens " + std::to_string(h.num_tokens));
  }
  if (off.back() != h.num_tokens)
    fail(h.path, "doc_offsets ends at " + std::to_string(off.back()) + ", not at num_tokens " +
                     std::to_string(h.num_tokens));

  h5::Handle file_space(DST_H5_CHECK(H5Dget_space(tokens_ds), where));
  std::vector<std::uint32_t> block;  // (kScanBlock,) at most
  std::size_t next_end = 1;          // index into off of the next document end to check
  for (std::uint64_t start = 0; start < h.num_tokens; start += kScanBlock) {
    const std::uint64_t count = std::min(kScanBlock, h.num_tokens - start);
    block.resize(count);
    const hsize_t f_start[1] = {start};
    const hsize_t f_count[1] = {count};
    DST_H5_CHECK(
        H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, f_start, nullptr, f_count, nullptr),
        where);
    h5::Handle mem_space(DST_H5_CHECK(H5Screate_simple(1, f_count, nullptr), where));
    DST_H5_CHECK(H5Dread(tokens_ds, H5T_NATIVE_UINT32, mem_space.get(), file_space.get(),
                         H5P_DEFAULT, block.data()),
                 where);
    for (std::uint64_t k = 0; k < count; ++k) {
      if (block[k] >= h.vocab_size)
        fail(h.path, "token " + std::to_string(start + k) + " has id " + std::to_string(block[k]) +
                         ", outside the vocabulary of " + std::to_string(h.vocab_size));
    }
    // Each document's last token (off[d] - 1) falling in this block must be EOS.
    while (next_end < off.size() && off[next_end] - 1 < start + count) {
      const std::uint64_t last = off[next_end] - 1;
      if (block[last - start] != h.eos_id)
        fail(h.path, "document " + std::to_string(next_end - 1) + " ends with token id " +
                         std::to_string(block[last - start]) + " at " + std::to_string(last) +
                         ", not with eos_id " + std::to_string(h.eos_id));
      ++next_end;
    }
  }
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

ShardHeader validate_shard(const std::string& path, ShardCheck level) {
  if (ends_with(path, kShardTmpSuffix))
    fail(path, "is an unfinished shard (a write-then-rename temporary); it is never read");
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) fail(path, "no such file");

  h5::Lock lock;
  const std::string where = shard_where(path);
  if (H5Fis_hdf5(path.c_str()) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    fail(path, "is not an HDF5 file");
  }
  h5::Handle file(DST_H5_CHECK(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), where));
  const hid_t f = file.get();

  ShardHeader h;
  h.path = path;
  const std::string format = read_string_attr(f, "format", path);
  if (format != kShardFormatName)
    fail(path, "attribute 'format' is '" + format + "', expected '" + kShardFormatName + "'");
  const std::int64_t version = read_int_attr(f, "format_version", path);
  if (version != kShardFormatVersion)
    fail(path, "format_version " + std::to_string(version) +
                   " is not supported (this dstrain reads version " +
                   std::to_string(kShardFormatVersion) + ")");
  h.format_version = static_cast<std::uint32_t>(version);
  h.vocab_size = static_cast<std::uint64_t>(read_int_attr(f, "vocab_size", path));
  if (h.vocab_size < 1 || h.vocab_size > kMaxVocabSize)
    fail(path, "vocab_size " + std::to_string(h.vocab_size) + " is outside [1, " +
                   std::to_string(kMaxVocabSize) + "]");
  h.eos_id = static_cast<std::uint64_t>(read_int_attr(f, "eos_id", path));
  if (h.eos_id >= h.vocab_size)
    fail(path, "eos_id " + std::to_string(h.eos_id) + " is outside the vocabulary of " +
                   std::to_string(h.vocab_size));
  h.tokenizer.name = read_string_attr(f, "tokenizer_name", path);
  h.tokenizer.hash = read_string_attr(f, "tokenizer_hash", path);
  if (h.tokenizer.name.empty()) fail(path, "attribute 'tokenizer_name' is empty");
  if (h.tokenizer.hash.empty()) fail(path, "attribute 'tokenizer_hash' is empty");
  h.num_tokens = static_cast<std::uint64_t>(read_int_attr(f, "num_tokens", path));
  h.num_documents = static_cast<std::uint64_t>(read_int_attr(f, "num_documents", path));

  DatasetShape tokens = open_1d_integer(f, kTokensDataset, path);
  if (tokens.sign != H5T_SGN_NONE || (tokens.bytes != 2 && tokens.bytes != 4))
    fail(path, "dataset 'tokens' must be uint16 or uint32, found a " +
                   std::string(tokens.sign == H5T_SGN_NONE ? "uint" : "int") +
                   std::to_string(8 * tokens.bytes));
  if (tokens.bytes == 2 && h.vocab_size > kMaxVocabForUint16)
    fail(path, "dataset 'tokens' is uint16 but vocab_size " + std::to_string(h.vocab_size) +
                   " needs uint32");
  h.token_bytes = static_cast<int>(tokens.bytes);
  if (tokens.length != h.num_tokens)
    fail(path, "dataset 'tokens' holds " + std::to_string(tokens.length) +
                   " tokens but attribute num_tokens says " + std::to_string(h.num_tokens));
  check_stored(tokens, kTokensDataset, path);

  DatasetShape offsets = open_1d_integer(f, kOffsetsDataset, path);
  if (offsets.sign != H5T_SGN_NONE || offsets.bytes != 8)
    fail(path, "dataset 'doc_offsets' must be uint64");
  if (offsets.length != h.num_documents + 1)
    fail(path, "dataset 'doc_offsets' holds " + std::to_string(offsets.length) +
                   " entries but num_documents + 1 = " + std::to_string(h.num_documents + 1));
  check_stored(offsets, kOffsetsDataset, path);
  // Every document holds at least its EOS.
  if (h.num_documents > h.num_tokens)
    fail(path, "num_documents " + std::to_string(h.num_documents) + " exceeds num_tokens " +
                   std::to_string(h.num_tokens));

  if (level == ShardCheck::full)
    check_offsets_and_tokens(h, offsets.dataset.get(), tokens.dataset.get());
  return h;
}

void check_shards_agree(const std::vector<ShardHeader>& shards) {
  if (shards.empty()) return;
  const ShardHeader& ref = shards.front();
  for (std::size_t i = 1; i < shards.size(); ++i) {
    const ShardHeader& s = shards[i];
    auto disagree = [&](const char* what, const std::string& mine, const std::string& theirs) {
      throw DatasetError(shard_where(s.path) + ": " + what + " '" + mine +
                         "' disagrees with shard '" + ref.path + "' (" + theirs +
                         "): all shards of a dataset must come from one tokenizer");
    };
    if (s.format_version != ref.format_version)
      disagree("format_version", std::to_string(s.format_version),
               std::to_string(ref.format_version));
    if (s.tokenizer.name != ref.tokenizer.name)
      disagree("tokenizer_name", s.tokenizer.name, ref.tokenizer.name);
    if (s.tokenizer.hash != ref.tokenizer.hash)
      disagree("tokenizer_hash", s.tokenizer.hash, ref.tokenizer.hash);
    if (s.vocab_size != ref.vocab_size)
      disagree("vocab_size", std::to_string(s.vocab_size), std::to_string(ref.vocab_size));
    if (s.eos_id != ref.eos_id)
      disagree("eos_id", std::to_string(s.eos_id), std::to_string(ref.eos_id));
  }
}

std::string definition_hash(std::string_view definition) {
  char hex[17] = {0};
  std::snprintf(hex, sizeof hex, "%016llx",
                static_cast<unsigned long long>(core::hash_name(definition)));
  return std::string("fnv1a64:") + hex;
}

}  // namespace dst::data
