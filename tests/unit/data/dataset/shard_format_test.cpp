// The shard format: writer round trip, write-then-rename, shard resolution, agreement of
// shards, and validation of hostile shards (each must give an error naming the file).
#include <gtest/gtest.h>
#include <hdf5.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "data/dataset/shard_format.hpp"
#include "data/dataset/shard_writer.hpp"
#include "data/dataset/token_dataset.hpp"
#include "dataset_test_util.hpp"
#include "h5/lock.hpp"

namespace dst::data {
namespace {

using test::ScratchDir;

// Reads a whole 1-D dataset with plain HDF5 calls (an independent check of the writer).
template <class T>
std::vector<T> read_all(const std::string& path, const char* name, hid_t mem_type) {
  h5::Lock lock;
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  EXPECT_GE(f, 0);
  const hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
  const hid_t s = H5Dget_space(d);
  std::vector<T> out(static_cast<std::size_t>(H5Sget_simple_extent_npoints(s)));
  EXPECT_GE(H5Dread(d, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()), 0);
  H5Sclose(s);
  H5Dclose(d);
  H5Fclose(f);
  return out;
}

std::size_t dataset_type_size(const std::string& path) {
  h5::Lock lock;
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t d = H5Dopen2(f, kTokensDataset, H5P_DEFAULT);
  const hid_t t = H5Dget_type(d);
  const std::size_t size = H5Tget_size(t);
  H5Tclose(t);
  H5Dclose(d);
  H5Fclose(f);
  return size;
}

TEST(ShardWriter, RoundTripsTokensOffsetsAndAttributes) {
  ScratchDir dir("shard_rt");
  const std::string path = dir.file("a.h5");
  // 200 documents, ~2400 tokens in chunks of 64: many chunk boundaries.
  const ShardHeader written = test::write_corpus_shard(path, 0, 200);
  const auto stream = test::corpus_stream(0, 200);
  EXPECT_EQ(written.num_tokens, stream.size());
  EXPECT_EQ(written.num_documents, 200u);

  const ShardHeader h = validate_shard(path, ShardCheck::full);
  EXPECT_EQ(h.format_version, kShardFormatVersion);
  EXPECT_EQ(h.vocab_size, 260u);
  EXPECT_EQ(h.eos_id, 257u);
  EXPECT_EQ(h.tokenizer, test::byte_options().tokenizer);
  EXPECT_EQ(h.num_tokens, stream.size());
  EXPECT_EQ(h.num_documents, 200u);
  EXPECT_EQ(h.token_bytes, 2);
  EXPECT_EQ(dataset_type_size(path), 2u);

  EXPECT_EQ(read_all<std::int32_t>(path, kTokensDataset, H5T_NATIVE_INT32), stream);
  const auto off = read_all<std::uint64_t>(path, kOffsetsDataset, H5T_NATIVE_UINT64);
  ASSERT_EQ(off.size(), 201u);
  std::uint64_t at = 0;
  for (std::uint64_t d = 0; d < 200; ++d) {
    EXPECT_EQ(off[d], at);
    at += test::corpus_document(d).size() + 1;
  }
  EXPECT_EQ(off.back(), stream.size());
}

TEST(ShardWriter, UsesUint32WhenTheVocabularyNeedsIt) {
  ScratchDir dir("shard_u32");
  auto opt = test::byte_options();
  opt.vocab_size = 100000;
  opt.eos_id = 99999;
  opt.tokenizer = {"bpe-test", definition_hash("some merges")};
  const std::string path = dir.file("big.h5");
  ShardWriter w(path, opt);
  w.append_document({70000, 1, 65536, 99998});
  w.append_document({});  // an empty document is just its EOS
  w.close();
  const ShardHeader h = validate_shard(path);
  EXPECT_EQ(h.token_bytes, 4);
  EXPECT_EQ(h.num_documents, 2u);
  EXPECT_EQ(read_all<std::int32_t>(path, kTokensDataset, H5T_NATIVE_INT32),
            (std::vector<std::int32_t>{70000, 1, 65536, 99998, 99999, 99999}));
}

TEST(ShardWriter, AnEmptyShardIsValid) {
  ScratchDir dir("shard_empty");
  const std::string path = dir.file("empty.h5");
  ShardWriter(path, test::byte_options()).close();
  const ShardHeader h = validate_shard(path);
  EXPECT_EQ(h.num_tokens, 0u);
  EXPECT_EQ(h.num_documents, 0u);
  EXPECT_EQ(read_all<std::uint64_t>(path, kOffsetsDataset, H5T_NATIVE_UINT64),
            std::vector<std::uint64_t>{0});
}

TEST(ShardWriter, RejectsBadOptionsAndTokens) {
  ScratchDir dir("shard_bad");
  EXPECT_THROW(ShardWriter(dir.file("x.hdf5"), test::byte_options()), DatasetError);
  auto opt = test::byte_options();
  opt.eos_id = 260;
  EXPECT_THROW(ShardWriter(dir.file("x.h5"), opt), DatasetError);
  ShardWriter w(dir.file("y.h5"), test::byte_options());
  try {
    w.append_document({1, 2, 260});
    FAIL() << "token 260 accepted";
  } catch (const DatasetError& e) {
    EXPECT_NE(std::string(e.what()).find("token id 260 at position 2"), std::string::npos)
        << e.what();
  }
}

// Write-then-rename: until close() only `<name>.tmp` exists, and it is never a shard.
TEST(ShardWriter, PublishesByRenameAndAnUnfinishedShardIsNeverRead) {
  ScratchDir dir("shard_tmp");
  test::write_corpus_shard(dir.file("a.h5"), 0, 10);
  const std::string b = dir.file("b.h5");
  {
    ShardWriter w(b, test::byte_options());
    w.append_document({1, 2, 3});
    EXPECT_FALSE(std::filesystem::exists(b));
    EXPECT_TRUE(std::filesystem::exists(b + ".tmp"));
    // While b is being written, every way of naming the dataset sees only a.h5.
    EXPECT_EQ(resolve_shard_paths(dir.str()), std::vector<std::string>{dir.file("a.h5")});
    EXPECT_EQ(resolve_shard_paths(dir.str() + "/*"), std::vector<std::string>{dir.file("a.h5")});
    EXPECT_THROW(validate_shard(b + ".tmp"), DatasetError);
    EXPECT_THROW(validate_shard(b), DatasetError);
    // The writer is abandoned (an error, a crash): the temporary goes, b never appears.
  }
  EXPECT_FALSE(std::filesystem::exists(b + ".tmp"));
  EXPECT_FALSE(std::filesystem::exists(b));

  // A crashed writer's leftover .tmp (here a copy of a complete shard, the most
  // convincing impostor) is still skipped by globs and folders, and refused by name.
  std::filesystem::copy_file(dir.file("a.h5"), dir.file("c.h5.tmp"));
  EXPECT_EQ(resolve_shard_paths(dir.str()).size(), 1u);
  try {
    validate_shard(dir.file("c.h5.tmp"));
    FAIL() << "a .tmp was accepted as a shard";
  } catch (const DatasetError& e) {
    EXPECT_NE(std::string(e.what()).find("c.h5.tmp"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("unfinished"), std::string::npos);
  }
  std::ofstream(dir.file("list.manifest")) << "a.h5\nc.h5.tmp\n";
  EXPECT_THROW(resolve_shard_paths(dir.file("list.manifest")), DatasetError);

  ShardWriter w(b, test::byte_options());
  w.append_document({4, 5});
  w.close();
  EXPECT_TRUE(std::filesystem::exists(b));
  EXPECT_FALSE(std::filesystem::exists(b + ".tmp"));
  EXPECT_THROW(w.close(), DatasetError);
}

TEST(ResolveShardPaths, GlobFolderManifestAndSingleFile) {
  ScratchDir dir("shard_resolve");
  for (const char* name : {"b.h5", "a.h5", "c.h5"})
    test::write_corpus_shard(dir.file(name), 0, 3);
  std::ofstream(dir.file("notes.txt")) << "not a shard\n";
  const std::vector<std::string> sorted = {dir.file("a.h5"), dir.file("b.h5"), dir.file("c.h5")};
  EXPECT_EQ(resolve_shard_paths(dir.str()), sorted);
  EXPECT_EQ(resolve_shard_paths(dir.str() + "/*.h5"), sorted);
  EXPECT_EQ(resolve_shard_paths(dir.file("b.h5")), std::vector<std::string>{dir.file("b.h5")});
  // A manifest keeps its own order; relative names are relative to its folder.
  std::ofstream(dir.file("m.manifest")) << "# train split\nc.h5\n\n  a.h5  \n"
                                        << dir.file("b.h5") << "\n";
  EXPECT_EQ(resolve_shard_paths(dir.file("m.manifest")),
            (std::vector<std::string>{dir.file("c.h5"), dir.file("a.h5"), dir.file("b.h5")}));
  EXPECT_THROW(resolve_shard_paths(dir.str() + "/*.nothing"), DatasetError);
  EXPECT_THROW(resolve_shard_paths(dir.file("missing-manifest")), DatasetError);
}

TEST(CheckShardsAgree, NamesTheFirstDisagreeingShard) {
  ScratchDir dir("shard_agree");
  std::vector<ShardHeader> h;
  h.push_back(test::write_corpus_shard(dir.file("a.h5"), 0, 3));
  h.push_back(test::write_corpus_shard(dir.file("b.h5"), 3, 3));
  auto other = test::byte_options();
  other.tokenizer.hash = definition_hash("a different byte tokenizer");
  h.push_back(test::write_corpus_shard(dir.file("c.h5"), 6, 3, other));
  h.push_back(test::write_corpus_shard(dir.file("d.h5"), 9, 3, other));
  EXPECT_NO_THROW(check_shards_agree({h[0], h[1]}));
  try {
    check_shards_agree(h);
    FAIL() << "disagreeing shards accepted";
  } catch (const DatasetError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("shard '" + dir.file("c.h5") + "'"), std::string::npos) << m;
    EXPECT_NE(m.find("tokenizer_hash"), std::string::npos) << m;
    EXPECT_NE(m.find(dir.file("a.h5")), std::string::npos) << m;
    EXPECT_EQ(m.find("d.h5"), std::string::npos) << m;  // the first disagreement only
  }
  h[1].vocab_size = 300;
  try {
    check_shards_agree(h);
    FAIL();
  } catch (const DatasetError& e) {
    EXPECT_NE(std::string(e.what()).find("b.h5"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("vocab_size"), std::string::npos) << e.what();
  }
}

TEST(DefinitionHash, IsStableAndNamesItsAlgorithm) {
  EXPECT_EQ(definition_hash(""), "fnv1a64:cbf29ce484222325");  // the FNV-1a offset basis
  EXPECT_NE(definition_hash("a"), definition_hash("b"));
}

// --- hostile shards ----------------------------------------------------------------

// A valid shard changed by `edit` with raw HDF5 calls (run with the file open read-write).
std::string hostile(const ScratchDir& dir, const std::string& name,
                    const std::function<void(hid_t)>& edit) {
  const std::string path = dir.file(name);
  test::write_corpus_shard(path, 0, 20);
  h5::Lock lock;
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  EXPECT_GE(f, 0);
  edit(f);
  EXPECT_GE(H5Fclose(f), 0);
  return path;
}

void replace_dataset(hid_t f, const char* name, hid_t type, const std::vector<hsize_t>& dims,
                     const void* data, hid_t mem_type) {
  H5Ldelete(f, name, H5P_DEFAULT);
  const hid_t s = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  const hid_t d = H5Dcreate2(f, name, type, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (data != nullptr) H5Dwrite(d, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
  H5Dclose(d);
  H5Sclose(s);
}

void set_u64_attr(hid_t f, const char* name, std::uint64_t v) {
  const hid_t a = H5Aopen(f, name, H5P_DEFAULT);
  H5Awrite(a, H5T_NATIVE_UINT64, &v);
  H5Aclose(a);
}

// Expects validation to fail with a message naming the file and containing `what`.
void expect_rejected(const std::string& path, const std::string& what,
                     ShardCheck level = ShardCheck::full) {
  try {
    validate_shard(path, level);
    ADD_FAILURE() << path << " was accepted (expected: " << what << ")";
  } catch (const DatasetError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(path), std::string::npos) << m;
    EXPECT_NE(m.find(what), std::string::npos) << "expected '" << what << "' in: " << m;
  }
}

TEST(ValidateShard, RejectsWrongDtypes) {
  ScratchDir dir("hostile_dtype");
  const std::uint64_t n = test::corpus_stream(0, 20).size();  // 262 tokens
  const std::vector<float> f(n, 1.0f);
  expect_rejected(hostile(dir, "float.h5",
                          [&](hid_t file) {
                            replace_dataset(file, kTokensDataset, H5T_IEEE_F32LE, {n}, f.data(),
                                            H5T_NATIVE_FLOAT);
                          }),
                  "must hold integers");
  expect_rejected(hostile(dir, "signed.h5",
                          [&](hid_t file) {
                            replace_dataset(file, kTokensDataset, H5T_STD_I16LE, {n}, nullptr, 0);
                          }),
                  "must be uint16 or uint32, found a int16");
  expect_rejected(hostile(dir, "u8.h5",
                          [&](hid_t file) {
                            replace_dataset(file, kTokensDataset, H5T_STD_U8LE, {n}, nullptr, 0);
                          }),
                  "found a uint8");
  expect_rejected(
      hostile(dir, "u16big.h5", [&](hid_t file) { set_u64_attr(file, "vocab_size", 100000); }),
      "is uint16 but vocab_size 100000 needs uint32");
  expect_rejected(hostile(dir, "off32.h5",
                          [&](hid_t file) {
                            replace_dataset(file, kOffsetsDataset, H5T_STD_U32LE, {21}, nullptr, 0);
                          }),
                  "'doc_offsets' must be uint64");
  expect_rejected(
      hostile(dir, "twod.h5",
              [&](hid_t file) {
                replace_dataset(file, kTokensDataset, H5T_STD_U16LE, {5, 51}, nullptr, 0);
              }),
      "must be one-dimensional");
}

TEST(ValidateShard, RejectsBadOffsets) {
  ScratchDir dir("hostile_offsets");
  auto with_offsets = [&](const std::string& name, std::vector<std::uint64_t> off) {
    return hostile(dir, name, [&](hid_t file) {
      replace_dataset(file, kOffsetsDataset, H5T_STD_U64LE, {off.size()}, off.data(),
                      H5T_NATIVE_UINT64);
    });
  };
  auto valid = [] {
    std::vector<std::uint64_t> off{0};
    for (std::uint64_t d = 0; d < 20; ++d)
      off.push_back(off.back() + test::corpus_document(d).size() + 1);
    return off;
  };
  auto off = valid();
  off[7] = 100000;
  expect_rejected(with_offsets("range.h5", off),
                  "doc_offsets[7] = 100000 is beyond num_tokens 262");
  off = valid();
  off[20] = 300;
  expect_rejected(with_offsets("end.h5", off), "doc_offsets[20] = 300 is beyond num_tokens 262");
  off = valid();
  std::swap(off[3], off[4]);
  expect_rejected(with_offsets("order.h5", off), "not strictly increasing at index 4");
  off = valid();
  off[0] = 1;
  expect_rejected(with_offsets("first.h5", off), "doc_offsets[0] is 1");
  off = valid();
  off[5] += 1;  // document 4 now ends one token late, not on its EOS
  expect_rejected(with_offsets("eos.h5", off), "document 4 ends with token id");
  off = valid();
  off.pop_back();
  expect_rejected(with_offsets("short.h5", off), "holds 20 entries but num_documents + 1 = 21",
                  ShardCheck::header);
}

TEST(ValidateShard, RejectsMissingOrMistypedAttributes) {
  ScratchDir dir("hostile_attrs");
  for (const char* attr : {"format", "format_version", "vocab_size", "eos_id", "tokenizer_name",
                           "tokenizer_hash", "num_tokens", "num_documents"}) {
    const std::string path =
        hostile(dir, std::string("no_") + attr + ".h5", [&](hid_t file) { H5Adelete(file, attr); });
    expect_rejected(path, std::string("attribute '") + attr + "' is missing", ShardCheck::header);
  }
  expect_rejected(hostile(dir, "strvocab.h5",
                          [](hid_t file) {
                            H5Adelete(file, "vocab_size");
                            const hid_t t = H5Tcopy(H5T_C_S1);
                            H5Tset_size(t, 4);
                            const hid_t s = H5Screate(H5S_SCALAR);
                            const hid_t a =
                                H5Acreate2(file, "vocab_size", t, s, H5P_DEFAULT, H5P_DEFAULT);
                            H5Awrite(a, t, "260");
                            H5Aclose(a);
                            H5Sclose(s);
                            H5Tclose(t);
                          }),
                  "attribute 'vocab_size' must be an integer");
  expect_rejected(
      hostile(dir, "v2.h5", [](hid_t file) { set_u64_attr(file, "format_version", 2); }),
      "format_version 2 is not supported");
  expect_rejected(hostile(dir, "eos.h5", [](hid_t file) { set_u64_attr(file, "eos_id", 260); }),
                  "eos_id 260 is outside the vocabulary");
  expect_rejected(
      hostile(dir, "vocab0.h5", [](hid_t file) { set_u64_attr(file, "vocab_size", 0); }),
      "vocab_size 0 is outside");
}

TEST(ValidateShard, RejectsTruncatedAndForgedTokenArrays) {
  ScratchDir dir("hostile_trunc");
  // The token array is shorter than num_tokens says.
  expect_rejected(hostile(dir, "short.h5",
                          [](hid_t file) {
                            const hid_t d = H5Dopen2(file, kTokensDataset, H5P_DEFAULT);
                            const hsize_t n[1] = {200};
                            H5Dset_extent(d, n);
                            H5Dclose(d);
                          }),
                  "holds 200 tokens but attribute num_tokens says 262", ShardCheck::header);
  // A header claiming 2^50 tokens with nothing stored must not make us allocate them.
  expect_rejected(hostile(dir, "forged.h5",
                          [](hid_t file) {
                            const hid_t d = H5Dopen2(file, kTokensDataset, H5P_DEFAULT);
                            const hsize_t n[1] = {std::uint64_t{1} << 50};
                            H5Dset_extent(d, n);
                            H5Dclose(d);
                            set_u64_attr(file, "num_tokens", std::uint64_t{1} << 50);
                          }),
                  "less than its");
  // An id outside the vocabulary (only the full check reads every token).
  const std::string bad_id = hostile(dir, "id.h5", [](hid_t file) {
    const hid_t d = H5Dopen2(file, kTokensDataset, H5P_DEFAULT);
    const hid_t s = H5Dget_space(d);
    const hsize_t at[1] = {17}, one[1] = {1};
    H5Sselect_hyperslab(s, H5S_SELECT_SET, at, nullptr, one, nullptr);
    const hid_t m = H5Screate_simple(1, one, nullptr);
    const std::uint32_t v = 300;
    H5Dwrite(d, H5T_NATIVE_UINT32, m, s, H5P_DEFAULT, &v);
    H5Sclose(m);
    H5Sclose(s);
    H5Dclose(d);
  });
  EXPECT_NO_THROW(validate_shard(bad_id, ShardCheck::header));
  expect_rejected(bad_id, "token 17 has id 300, outside the vocabulary of 260");
}

TEST(ValidateShard, RejectsFilesThatAreNotShards) {
  ScratchDir dir("hostile_files");
  expect_rejected(dir.file("missing.h5"), "no such file");
  std::ofstream(dir.file("text.h5")) << "this is not HDF5\n";
  expect_rejected(dir.file("text.h5"), "is not an HDF5 file");
  std::ofstream(dir.file("empty.h5")).flush();
  expect_rejected(dir.file("empty.h5"), "is not an HDF5 file");
  // A shard cut short on disk (a copy interrupted): the header or the data is gone.
  const std::string full = dir.file("full.h5");
  test::write_corpus_shard(full, 0, 400);
  const auto size = std::filesystem::file_size(full);
  for (const double keep : {0.02, 0.5, 0.9}) {
    const std::string cut = dir.file("cut" + std::to_string(static_cast<int>(keep * 100)) + ".h5");
    std::filesystem::copy_file(full, cut);
    std::filesystem::resize_file(cut,
                                 static_cast<std::uintmax_t>(static_cast<double>(size) * keep));
    try {
      validate_shard(cut, ShardCheck::full);
      ADD_FAILURE() << cut << " accepted";
    } catch (const DatasetError& e) {
      EXPECT_NE(std::string(e.what()).find(cut), std::string::npos) << e.what();
    }
  }
  // A group where a dataset should be.
  expect_rejected(
      hostile(dir, "group.h5",
              [](hid_t file) {
                H5Ldelete(file, kTokensDataset, H5P_DEFAULT);
                H5Gclose(H5Gcreate2(file, kTokensDataset, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
              }),
      "H5Dopen2");
  expect_rejected(
      hostile(dir, "nooff.h5", [](hid_t file) { H5Ldelete(file, kOffsetsDataset, H5P_DEFAULT); }),
      "dataset 'doc_offsets' is missing");
}

}  // namespace
}  // namespace dst::data
