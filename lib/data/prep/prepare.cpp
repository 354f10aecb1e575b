#include "data/prep/prepare.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <system_error>

#include "core/exit_codes.hpp"
#include "data/byte_vocab.hpp"
#include "data/dataset/shard_writer.hpp"
#include "runtime/mpi_check.hpp"
#include "runtime/mpi_collectives.hpp"

namespace dst::data {

namespace fs = std::filesystem;

namespace {

constexpr const char* kSplitName[2] = {"train", "valid"};

std::string shard_name(const std::string& name, int split, int rank, std::uint64_t k) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "-%s-%05d-%05llu.h5", kSplitName[split], rank,
                static_cast<unsigned long long>(k));
  return name + buf;
}

std::string manifest_name(const std::string& name, int split) {
  return name + "-" + kSplitName[split] + ".manifest";
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// Whether `file` (a name in the output folder) belongs to dataset `name`: its shards,
/// manifests, or their unfinished `.tmp`s.
bool belongs_to(const std::string& file, const std::string& name) {
  std::string f = file;
  if (ends_with(f, kShardTmpSuffix)) f.resize(f.size() - std::string(kShardTmpSuffix).size());
  for (int s = 0; s < 2; ++s) {
    if (f == manifest_name(name, s)) return true;
    const std::string prefix = name + "-" + kSplitName[s] + "-";
    if (f.rfind(prefix, 0) == 0 && ends_with(f, kShardSuffix)) return true;
  }
  return false;
}

/// Prep's collectives over `comm`, named "prep: <step>" in timeout messages.
runtime::MpiCollectives prep_collectives(MPI_Comm comm, double timeout_s) {
  return runtime::MpiCollectives(comm, timeout_s,
                                 [](const std::string& step) { return "prep: " + step; });
}

/// Collective: if any rank has `ok == false`, every rank throws CollectiveError with the
/// message of the lowest such rank (sent by it), so the application prints it once.
void agree(MPI_Comm comm, bool ok, const std::string& message, double timeout_s, const char* step) {
  const auto failure =
      prep_collectives(comm, timeout_s)
          .first_failure(ok ? std::nullopt : std::optional<std::string>(message), step);
  if (failure) throw CollectiveError(failure->message, kExitError);
}

/// Writes `path` (through `path.tmp`, fsync, rename) so a manifest that exists is whole.
void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + kShardTmpSuffix;
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw Error("prep: cannot create '" + tmp + "': " + std::strerror(errno));
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw Error("prep: cannot write '" + tmp + "': " + std::strerror(err));
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    throw Error("prep: cannot flush '" + tmp + "': " + std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw Error("prep: cannot rename '" + tmp + "' to '" + path + "': " + std::strerror(errno));
}

/// One rank's shards of one split, written one after another.
class SplitWriter {
 public:
  SplitWriter(const PrepOptions& o, const PrepTokenizer& t, int split, int rank)
      : options_(o), split_(split), rank_(rank) {
    writer_options_.vocab_size = t.vocab_size;
    writer_options_.eos_id = t.eos_id;
    writer_options_.tokenizer = t.identity;
    writer_options_.chunk_tokens = o.chunk_tokens;
    const double token_bytes = t.vocab_size <= kMaxVocabForUint16 ? 2.0 : 4.0;
    target_tokens_ = static_cast<std::uint64_t>(o.shard_mb * 1048576.0 / token_bytes);
    if (target_tokens_ < 1) target_tokens_ = 1;
  }

  /// Appends one document (EOS added by the writer); returns the tokens stored.
  std::uint64_t append(const std::vector<TokenId>& ids) {
    if (!writer_) {
      const std::string path =
          (fs::path(options_.out_dir) / shard_name(options_.name, split_, rank_, done_.size()))
              .string();
      writer_ = std::make_unique<ShardWriter>(path, writer_options_);
    }
    writer_->append_document(ids);
    if (writer_->num_tokens() >= target_tokens_) close();
    return ids.size() + 1;
  }

  void close() {
    if (!writer_) return;
    writer_->close();
    done_.push_back(writer_->path());
    writer_.reset();
  }

  /// Error path: drops the open shard (its .tmp is deleted) and removes finished ones.
  void discard() noexcept {
    writer_.reset();
    for (const auto& p : done_) {
      std::error_code ec;
      fs::remove(p, ec);
    }
    done_.clear();
  }

  std::uint64_t shards() const { return done_.size() + (writer_ ? 1 : 0); }

 private:
  const PrepOptions& options_;
  int split_;
  int rank_;
  ShardWriterOptions writer_options_;
  std::uint64_t target_tokens_ = 0;
  std::unique_ptr<ShardWriter> writer_;
  std::vector<std::string> done_;
};

/// Counters summed over ranks at a synchronisation point, with the failure flag.
struct SyncResult {
  bool failed = false;
  PrepCounts counts;
};

SyncResult synchronise(MPI_Comm comm, bool failed, const PrepCounts& mine, double timeout_s) {
  // (7,) failed, documents[2], tokens[2], shards[2]
  std::uint64_t counts[7] = {failed ? 1u : 0u, mine.documents[0], mine.documents[1], mine.tokens[0],
                             mine.tokens[1],   mine.shards[0],    mine.shards[1]};
  prep_collectives(comm, timeout_s)
      .allreduce(counts, 7, MPI_UINT64_T, MPI_SUM,
                 "synchronisation of the ranks (a rank is slower than --timeout, or hung)");
  SyncResult r;
  r.failed = counts[0] > 0;
  for (int s = 0; s < 2; ++s) {
    r.counts.documents[s] = counts[1 + s];
    r.counts.tokens[s] = counts[3 + s];
    r.counts.shards[s] = counts[5 + s];
  }
  return r;
}

}  // namespace

TokenizerIdentity byte_tokenizer_identity() {
  // The definition text is what the hash stands for: changing a byte id changes it.
  return {"byte260", definition_hash("byte260: ids 0..255 bytes, 256 bos, 257 eos")};
}

PrepSummary prepare_dataset(MPI_Comm comm, const PrepTokenizer& tok, const PrepOptions& opt,
                            const std::function<void(const PrepProgress&)>& progress) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  int rank = 0, size = 1;
  DST_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  DST_MPI_CHECK(MPI_Comm_size(comm, &size));

  // --- inputs and the output folder (every rank lists the inputs; rank 0 the folder)
  std::vector<std::string> files;
  std::uint64_t total_bytes = 0;
  std::string problem;
  try {
    if (!tok.tokenizer) throw Error("prep: no tokenizer");
    files = expand_inputs(opt.inputs);
    for (const auto& f : files) {
      if (f == kStdinName) {
        if (size > 1)
          throw InputError(
              "prep: standard input ('-') is read by one process: run prep on one rank, or "
              "give files");
        total_bytes = 0;
        break;
      }
      std::error_code ec;
      const auto n = fs::file_size(f, ec);
      if (!ec) total_bytes += n;
    }
    if (rank == 0) {
      fs::create_directories(opt.out_dir);
      std::vector<std::string> existing;
      for (const auto& e : fs::directory_iterator(opt.out_dir)) {
        const std::string f = e.path().filename().string();
        if (belongs_to(f, opt.name)) existing.push_back(e.path().string());
      }
      if (!existing.empty() && !opt.overwrite)
        throw Error("prep: '" + opt.out_dir + "' already holds dataset '" + opt.name + "' (" +
                    existing.front() + (existing.size() > 1 ? ", ..." : "") +
                    "); pass --overwrite to replace it, or choose another --name");
      for (const auto& p : existing)
        fs::remove(p);
    }
  } catch (const std::exception& e) {  // filesystem_error too
    problem = e.what();
  }
  agree(comm, problem.empty(), problem, opt.timeout_s, "checking inputs and output folder");

  // --- scan, tokenize, write
  SplitWriter writers[2] = {SplitWriter(opt, tok, 0, rank), SplitWriter(opt, tok, 1, rank)};
  PrepCounts mine;
  std::uint64_t index = 0;             // global document index
  std::uint64_t in_split[2] = {0, 0};  // documents of each split so far (all ranks)
  std::uint64_t bytes_done = 0;        // bytes of the inputs finished
  std::uint64_t since_sync_docs = 0, since_sync_bytes = 0;
  bool failed = false, stopped = false;
  std::string message;
  const auto report = [&](const SyncResult& g, std::uint64_t scanned) {
    if (rank != 0 || !progress) return;
    PrepProgress p;
    p.bytes_scanned = scanned;
    p.total_bytes = total_bytes;
    p.counts = g.counts;
    p.seconds = seconds();
    progress(p);
  };
  try {
    std::vector<TokenId> ids;
    for (const auto& file : files) {
      DocumentReader reader(file, opt.input);
      std::uint64_t last_scanned = 0;
      for (;;) {
        // Round robin within each split, so that both splits spread evenly over the
        // ranks (a split by index mod 20 would otherwise land on the odd ranks only).
        const int split = opt.valid.held_out(index) ? 1 : 0;
        const bool own =
            in_split[split] % static_cast<std::uint64_t>(size) == static_cast<std::uint64_t>(rank);
        if (!reader.next(own)) break;
        ++in_split[split];
        if (own) {
          const std::string text = reader.text();
          ids.clear();
          tok.tokenizer->encode_into(text, ids, false);
          mine.tokens[split] += writers[split].append(ids);
          ++mine.documents[split];
          mine.shards[split] = writers[split].shards();
        }
        ++index;
        ++since_sync_docs;
        since_sync_bytes += reader.bytes_scanned() - last_scanned;
        last_scanned = reader.bytes_scanned();
        // Standard input is read by a single rank: nobody to synchronise with.
        if (file != kStdinName &&
            (since_sync_docs >= opt.sync_documents || since_sync_bytes >= opt.sync_bytes)) {
          since_sync_docs = since_sync_bytes = 0;
          const SyncResult g = synchronise(comm, false, mine, opt.timeout_s);
          if (g.failed) {
            stopped = true;
            break;
          }
          report(g, bytes_done + reader.bytes_scanned());
        }
      }
      if (stopped) break;
      bytes_done += reader.bytes_scanned();
    }
    if (!stopped)
      for (auto& w : writers)
        w.close();
  } catch (const TimeoutError&) {
    throw;  // the job ends (runtime abort): the peers are not reachable
  } catch (const std::exception& e) {
    failed = true;
    message = e.what();
  }
  SyncResult total;
  if (!stopped) {  // the failing rank's announcement, or everyone's final count
    total = synchronise(comm, failed, mine, opt.timeout_s);
    stopped = total.failed;
  }
  if (stopped) {
    for (auto& w : writers)
      w.discard();
    agree(comm, !failed, message, opt.timeout_s, "reporting an input error");
    throw CollectiveError("prep: a rank failed without a message", kExitError);  // unreachable
  }
  report(total, bytes_done);

  // --- manifests (rank 0), from every rank's shard counts
  PrepSummary summary;
  summary.counts = total.counts;
  summary.input_bytes = bytes_done;
  summary.ranks = size;
  if (total.counts.documents[0] == 0) {
    for (auto& w : writers)
      w.discard();
    throw CollectiveError("prep: no training document in the inputs" +
                              std::string(total.counts.documents[1] > 0
                                              ? " (every document was held out for validation)"
                                              : ""),
                          kExitError);
  }
  std::vector<std::uint64_t> counts(2 * static_cast<std::size_t>(size));  // (ranks, 2)
  const std::uint64_t own_counts[2] = {writers[0].shards(), writers[1].shards()};
  prep_collectives(comm, opt.timeout_s)
      .gather(own_counts, 2, MPI_UINT64_T, counts.data(), 0, "gathering the shard lists");
  problem.clear();
  for (int s = 0; s < 2; ++s) {
    if (total.counts.documents[s] == 0) continue;
    const std::string path = (fs::path(opt.out_dir) / manifest_name(opt.name, s)).string();
    (s == 0 ? summary.train_manifest : summary.valid_manifest) = path;
    if (rank != 0) continue;
    std::string text = "# dstrain prep: " + std::string(kSplitName[s]) + " split of '" + opt.name +
                       "', " + std::to_string(total.counts.documents[s]) + " documents, " +
                       std::to_string(total.counts.tokens[s]) + " tokens, tokenizer " +
                       tok.identity.name + " (" + tok.identity.hash + "), written by " +
                       std::to_string(size) + " ranks\n";
    for (int r = 0; r < size; ++r)
      for (std::uint64_t k = 0; k < counts[2 * static_cast<std::size_t>(r) + s]; ++k)
        text += shard_name(opt.name, s, r, k) + "\n";
    try {
      write_file_atomically(path, text);
    } catch (const std::exception& e) {
      problem = e.what();
    }
  }
  try {
    agree(comm, problem.empty(), problem, opt.timeout_s, "writing the manifests");
  } catch (const CollectiveError&) {
    for (auto& w : writers)
      w.discard();
    throw;
  }
  summary.seconds = seconds();
  return summary;
}

}  // namespace dst::data
