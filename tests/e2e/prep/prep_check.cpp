// Checks what `dstrain prep` wrote against its input, independently of prep's readers.
//   prep_check jsonl TEXT SEP OUT.jsonl
//       writes TEXT's documents (separated by lines equal to SEP) as JSON Lines
//       {"id": n, "body": ...}, with a blank line after the first (blank lines are skipped)
//   prep_check compare TEXT SEP VALID_EVERY MANIFEST...
//       validates every shard the manifests list (validate_shard full), decodes their
//       byte-level documents, and checks that together they are TEXT's documents (as a
//       multiset). With VALID_EVERY > 0 the last manifest must hold exactly documents
//       VALID_EVERY-1, 2*VALID_EVERY-1, ... of TEXT (the held-out split). Also checks that
//       no unfinished `.tmp` is left next to the manifests.
#include <hdf5.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "data/byte_vocab.hpp"
#include "data/dataset/detail/h5.hpp"
#include "data/dataset/shard_format.hpp"
#include "h5/handle.hpp"
#include "h5/lock.hpp"

namespace fs = std::filesystem;
using namespace dst::data;

namespace {

[[noreturn]] void fail(const std::string& what) {
  std::cerr << "prep_check: FAIL: " << what << "\n";
  std::exit(1);
}

/// TEXT's documents: lines up to a line equal to `sep`, each line with its '\n'; empty
/// documents dropped. Written without prep's DocumentReader, on purpose.
std::vector<std::string> documents_of(const std::string& path, const std::string& sep) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read " + path);
  std::vector<std::string> docs;
  std::string line, doc;
  while (std::getline(in, line)) {
    if (line == sep) {
      if (!doc.empty()) docs.push_back(doc);
      doc.clear();
    } else {
      doc += line + "\n";
    }
  }
  if (!doc.empty()) docs.push_back(doc);
  return docs;
}

template <class T>
std::vector<T> read_dataset(hid_t file, const char* name, hid_t mem_type, const std::string& path) {
  dst::h5::Handle ds(DST_H5_CHECK(H5Dopen2(file, name, H5P_DEFAULT), path));
  dst::h5::Handle space(DST_H5_CHECK(H5Dget_space(ds.get()), path));
  const hssize_t n = DST_H5_CHECK(H5Sget_simple_extent_npoints(space.get()), path);
  std::vector<T> out(static_cast<std::size_t>(n));
  if (n > 0)
    DST_H5_CHECK(H5Dread(ds.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()), path);
  return out;
}

/// The documents of one shard as byte strings (EOS dropped).
std::vector<std::string> shard_documents(const std::string& path) {
  const ShardHeader h = validate_shard(path, ShardCheck::full);
  if (h.vocab_size != kByteVocabSize || h.eos_id != static_cast<std::uint64_t>(kByteEos) ||
      h.tokenizer.name != "byte260")
    fail(path + ": not a byte-level shard");
  dst::h5::Lock lock;
  dst::h5::Handle f(DST_H5_CHECK(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), path));
  const auto tokens = read_dataset<std::int32_t>(f.get(), kTokensDataset, H5T_NATIVE_INT32, path);
  const auto offsets =
      read_dataset<std::uint64_t>(f.get(), kOffsetsDataset, H5T_NATIVE_UINT64, path);
  std::vector<std::string> docs;
  for (std::size_t d = 0; d + 1 < offsets.size(); ++d) {
    std::string s;
    for (std::uint64_t i = offsets[d]; i + 1 < offsets[d + 1]; ++i) {
      if (tokens[i] > 255) fail(path + ": special token inside document " + std::to_string(d));
      s.push_back(static_cast<char>(tokens[i]));
    }
    docs.push_back(s);
  }
  return docs;
}

std::vector<std::string> manifest_shards(const std::string& manifest) {
  std::ifstream in(manifest);
  if (!in) fail("cannot read manifest " + manifest);
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty() && line[0] != '#')
      out.push_back((fs::path(manifest).parent_path() / line).string());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> a(argv + 1, argv + argc);
  if (a.size() == 4 && a[0] == "jsonl") {
    const auto docs = documents_of(a[1], a[2]);
    std::ofstream out(a[3], std::ios::binary);
    for (std::size_t i = 0; i < docs.size(); ++i) {
      out << nlohmann::json{{"id", i}, {"body", docs[i]}}.dump() << "\n";
      if (i == 0) out << "\n";
    }
    std::cout << "prep_check: wrote " << docs.size() << " JSON Lines to " << a[3] << "\n";
    return 0;
  }
  if (a.size() < 5 || a[0] != "compare") {
    std::cerr
        << "usage: prep_check jsonl TEXT SEP OUT | compare TEXT SEP VALID_EVERY MANIFEST...\n";
    return 2;
  }
  auto want = documents_of(a[1], a[2]);
  const long valid_every = std::atol(a[3].c_str());
  std::vector<std::string> got, last;
  std::size_t shards = 0;
  for (std::size_t m = 4; m < a.size(); ++m) {
    last.clear();
    for (const auto& shard : manifest_shards(a[m])) {
      ++shards;
      for (auto& d : shard_documents(shard))
        last.push_back(std::move(d));
    }
    got.insert(got.end(), last.begin(), last.end());
    for (const auto& e : fs::directory_iterator(fs::path(a[m]).parent_path()))
      if (e.path().extension() == ".tmp") fail("unfinished file left: " + e.path().string());
  }
  if (valid_every > 0) {
    std::vector<std::string> held;
    for (std::size_t i = 0; i < want.size(); ++i)
      if ((i + 1) % static_cast<std::size_t>(valid_every) == 0) held.push_back(want[i]);
    std::sort(held.begin(), held.end());
    std::sort(last.begin(), last.end());
    if (held != last)
      fail("the held-out split has " + std::to_string(last.size()) + " documents, expected " +
           std::to_string(held.size()) + " (every " + a[3] + "th) or different ones");
  }
  std::sort(want.begin(), want.end());
  std::sort(got.begin(), got.end());
  if (want != got) {
    std::size_t i = 0;
    while (i < want.size() && i < got.size() && want[i] == got[i])
      ++i;
    fail("documents differ: input has " + std::to_string(want.size()) + ", shards have " +
         std::to_string(got.size()) + "; first difference at sorted position " + std::to_string(i));
  }
  std::cout << "prep_check: " << got.size() << " documents match the input (" << shards
            << " shards, all valid)\n";
  return 0;
}
