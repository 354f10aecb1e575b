/// \file token_dataset.cpp
/// Shard resolution and the collective open of a dataset.
#include "data/dataset/token_dataset.hpp"

#include <glob.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "runtime/mpi_collectives.hpp"

namespace dst::data {

namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::vector<std::string> glob_shards(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0) {
    for (std::size_t i = 0; i < g.gl_pathc; ++i)
      out.emplace_back(g.gl_pathv[i]);
  }
  globfree(&g);
  if (rc != 0 && rc != GLOB_NOMATCH)
    throw DatasetError("dataset '" + pattern + "': glob failed (code " + std::to_string(rc) + ")");
  return out;
}

std::vector<std::string> only_finished_shards(std::vector<std::string> paths) {
  paths.erase(std::remove_if(paths.begin(), paths.end(),
                             [](const std::string& p) { return !ends_with(p, kShardSuffix); }),
              paths.end());
  // Byte order, not the locale's collation: every machine must see the same stream.
  std::sort(paths.begin(), paths.end());
  return paths;
}

std::vector<std::string> read_manifest(const std::string& manifest) {
  std::ifstream in(manifest);
  if (!in) throw DatasetError("dataset manifest '" + manifest + "': cannot be opened");
  const fs::path dir = fs::path(manifest).parent_path();
  std::vector<std::string> out;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    const auto first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '#') continue;
    const auto last = line.find_last_not_of(" \t\r");
    const std::string entry = line.substr(first, last - first + 1);
    if (!ends_with(entry, kShardSuffix))
      throw DatasetError(
          "dataset manifest '" + manifest + "':" + std::to_string(line_no) + ": '" + entry +
          "' is not a shard (a shard's name ends in '" + kShardSuffix + "'" +
          (ends_with(entry, kShardTmpSuffix) ? "; a '.tmp' is an unfinished shard" : "") + ")");
    const fs::path p(entry);
    out.push_back(p.is_absolute() || dir.empty() ? p.string() : (dir / p).string());
  }
  return out;
}

// --- the broadcast of rank 0's result ------------------------------------------------

void put_u64(std::string& buf, std::uint64_t v) {
  buf.append(reinterpret_cast<const char*>(&v), sizeof v);
}
void put_str(std::string& buf, const std::string& s) {
  put_u64(buf, s.size());
  buf += s;
}

class Reader {
 public:
  explicit Reader(const std::string& buf) : buf_(buf) {}
  std::uint64_t u64() {
    std::uint64_t v = 0;
    std::memcpy(&v, take(sizeof v), sizeof v);
    return v;
  }
  std::string str() {
    const std::uint64_t n = u64();
    return std::string(take(n), n);
  }

 private:
  const char* take(std::uint64_t n) {
    DST_REQUIRE(pos_ + n <= buf_.size(), "dataset: malformed broadcast of the shard table");
    const char* p = buf_.data() + pos_;
    pos_ += n;
    return p;
  }
  const std::string& buf_;
  std::size_t pos_ = 0;
};

std::string encode(const std::vector<ShardHeader>& shards) {
  std::string buf;
  put_u64(buf, shards.size());
  for (const auto& s : shards) {
    put_str(buf, s.path);
    put_u64(buf, s.format_version);
    put_u64(buf, s.vocab_size);
    put_u64(buf, s.eos_id);
    put_str(buf, s.tokenizer.name);
    put_str(buf, s.tokenizer.hash);
    put_u64(buf, s.num_tokens);
    put_u64(buf, s.num_documents);
    put_u64(buf, static_cast<std::uint64_t>(s.token_bytes));
  }
  return buf;
}

std::vector<ShardHeader> decode(const std::string& buf) {
  Reader r(buf);
  std::vector<ShardHeader> shards(r.u64());
  for (auto& s : shards) {
    s.path = r.str();
    s.format_version = static_cast<std::uint32_t>(r.u64());
    s.vocab_size = r.u64();
    s.eos_id = r.u64();
    s.tokenizer.name = r.str();
    s.tokenizer.hash = r.str();
    s.num_tokens = r.u64();
    s.num_documents = r.u64();
    s.token_bytes = static_cast<int>(r.u64());
  }
  return shards;
}

}  // namespace

TokenDataset::TokenDataset(std::vector<ShardHeader> shards, int seq_len)
    : shards_(std::move(shards)), seq_len_(seq_len) {
  if (shards_.empty()) throw DatasetError("dataset: no shards");
  if (seq_len < 1)
    throw DatasetError("dataset: seq_len must be positive, got " + std::to_string(seq_len));
  check_shards_agree(shards_);
  for (const auto& s : shards_)
    starts_.push_back(starts_.back() + s.num_tokens);
  const auto t = static_cast<std::uint64_t>(seq_len);
  num_samples_ = num_tokens() >= t + 1 ? (num_tokens() - 1) / t : 0;
  if (num_samples_ == 0)
    throw DatasetError("dataset '" + shards_.front().path + "' (" + std::to_string(shards_.size()) +
                       " shards): " + std::to_string(num_tokens()) +
                       " tokens hold no sample of seq_len " + std::to_string(seq_len) +
                       " + 1 tokens");
}

std::vector<std::string> resolve_shard_paths(const std::string& source) {
  std::vector<std::string> paths;
  std::error_code ec;
  if (source.find_first_of("*?[") != std::string::npos) {
    paths = only_finished_shards(glob_shards(source));
  } else if (fs::is_directory(source, ec)) {
    std::vector<std::string> all;
    for (const auto& e : fs::directory_iterator(source, ec))
      all.push_back(e.path().string());
    paths = only_finished_shards(std::move(all));
  } else if (ends_with(source, kShardSuffix) || ends_with(source, kShardTmpSuffix)) {
    paths = {source};  // validate_shard names a missing file or a .tmp
  } else {
    paths = read_manifest(source);
  }
  if (paths.empty())
    throw DatasetError("dataset '" + source + "': no shard files (names ending in '" +
                       kShardSuffix + "') found");
  return paths;
}

TokenDataset open_dataset(MPI_Comm comm, const std::string& source, int seq_len, double timeout_s) {
  runtime::MpiCollectives coll(
      comm, timeout_s, [&](const std::string& op) { return "dataset '" + source + "': " + op; });
  runtime::RootResult table;
  if (coll.rank() == 0) {
    table = runtime::attempt([&] {
      std::vector<ShardHeader> shards;
      for (const auto& p : resolve_shard_paths(source))
        shards.push_back(validate_shard(p, ShardCheck::header));
      TokenDataset check(shards, seq_len);  // agreement and size, before broadcasting
      return encode(shards);
    });
  }
  // Rank 0's failure, too, reaches the other ranks, which are already waiting here.
  table = coll.broadcast_result(table, 0, "broadcast of the shard table");
  if (!table.ok) throw DatasetError(table.text);
  return TokenDataset(decode(table.text), seq_len);
}

}  // namespace dst::data
