#pragma once
/// \file batch_reader.hpp
/// Reads this rank's samples of a TokenDataset, one batch ahead of the training loop.
///
/// Use (one optimizer step of M micro-batches, ids from Sampler::next_step()):
///
///   BatchReader reader(dataset);             // prefetching on
///   reader.request(step_ids[0]);
///   for (m = 0; m < M; ++m) {
///     Batch b = reader.wait();               // b.tokens (B, T+1) int32, host memory
///     if (m + 1 < M) reader.request(step_ids[m + 1]); else reader.request(next step's [0]);
///     forward/backward on inputs = b.tokens[:, :T], targets = b.tokens[:, 1:]
///   }
///
/// Requests are served in order; any number may be outstanding. With prefetching, one
/// background thread does all of the reader's HDF5 work while the caller computes; the
/// caller's thread never enters HDF5. Every HDF5 call happens under h5::Lock, because
/// Debian's parallel HDF5 is not thread-safe (see h5/lock.hpp).
///
/// Files: each shard is opened with HDF5's MPI-IO driver on MPI_COMM_SELF, lazily, when
/// one of this rank's samples first lives in it, and at most max_open_shards stay open
/// (least recently used is closed first). MPI_COMM_SELF because an MPI-IO open is
/// collective over its communicator: with the dataset's communicator every rank would
/// have to open every shard at the same moment, which lazy per-rank opening avoids.
/// Reads are independent (H5FD_MPIO_INDEPENDENT), not collective: ranks read different
/// samples at different times, so there is no common access pattern for two-phase
/// collective I/O to merge, and a collective read would make every rank wait for the
/// slowest one's file system latency at every batch.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "data/dataset/token_dataset.hpp"

namespace dst::data {

struct BatchReaderOptions {
  /// Read on a background thread (needs MPI_THREAD_MULTIPLE: that thread calls MPI-IO
  /// while the caller runs collectives). Off: request() only records, wait() reads.
  bool prefetch = true;
  /// Shards kept open per rank. Each open shard holds a file handle and HDF5 metadata;
  /// 8 covers samples that cross a shard boundary plus a few shards of a mixed batch.
  int max_open_shards = 8;
  /// debug.inject_read_delay_ms: sleep this long before serving each request, to
  /// emulate a slow file system (the hidden-latency experiment). 0 in production.
  int inject_read_delay_ms = 0;
};

/// One batch: B samples of T+1 token ids each.
struct Batch {
  std::vector<std::uint64_t> sample_ids;  ///< (B,) as requested
  std::vector<std::int32_t> tokens;       ///< (B, T+1) row-major
  int seq_len = 0;                        ///< T
  std::size_t rows() const { return sample_ids.size(); }
  std::size_t cols() const { return static_cast<std::size_t>(seq_len) + 1; }
  /// Sample b's T+1 tokens.
  const std::int32_t* row(std::size_t b) const { return tokens.data() + b * cols(); }
};

/// Counters of the reader's work (for benchmarks and tests).
struct BatchReaderStats {
  std::uint64_t requests = 0;     ///< requests served
  std::uint64_t reads = 0;        ///< H5Dread calls (a sample crossing shards needs several)
  std::uint64_t shard_opens = 0;  ///< H5Fopen calls
  int max_open = 0;               ///< most shards open at once
};

class BatchReader {
 public:
  /// Copies what it needs of `dataset`. Opens no file yet. Throws dst::Error when
  /// prefetching is asked for but MPI does not provide MPI_THREAD_MULTIPLE, or when
  /// max_open_shards < 1.
  explicit BatchReader(const TokenDataset& dataset, BatchReaderOptions options = {});
  /// Stops the thread after its current read (outstanding requests are dropped) and
  /// closes the files.
  ~BatchReader();
  BatchReader(const BatchReader&) = delete;
  BatchReader& operator=(const BatchReader&) = delete;

  /// Queues a batch of sample ids, (B,), each < num_samples() (checked here: throws
  /// DatasetError naming the id). With prefetching the read starts at once.
  void request(std::vector<std::uint64_t> sample_ids);
  /// The batch of the oldest outstanding request, blocking until it is read. Rethrows a
  /// read error (a DatasetError naming the shard: a failed HDF5 call, a token id outside
  /// the vocabulary). Throws dst::Error when nothing is outstanding.
  Batch wait();
  /// Requests not yet returned by wait().
  std::size_t outstanding() const;
  /// The counters so far (consistent after wait() returned every request).
  BatchReaderStats stats() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dst::data
