/// \file batch_reader.cpp
/// BatchReader: the shard cache (lazy MPI-IO opens, LRU) and the prefetching thread.
#include "data/dataset/batch_reader.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "data/dataset/detail/h5.hpp"
#include "h5/handle.hpp"
#include "h5/lock.hpp"
#include "runtime/mpi_check.hpp"

namespace dst::data {

namespace {

std::string shard_where(const std::string& path) {
  return "shard '" + path + "'";
}

/// The open shards of one rank. Every member function makes HDF5 calls: the caller
/// holds h5::Lock and is the reader's only HDF5 thread.
class ShardCache {
 public:
  ShardCache(const TokenDataset& dataset, int max_open)
      : dataset_(dataset), max_open_(static_cast<std::size_t>(max_open)) {}

  /// Reads tokens [start, start + count) of the concatenated stream into out (count,).
  void read_stream(std::uint64_t start, std::uint64_t count, std::int32_t* out,
                   BatchReaderStats& stats) {
    while (count > 0) {
      // The shard holding `start`: the last one that starts at or before it (an empty
      // shard starts where its successor does, so it is never that last one).
      const std::size_t s = shard_of(start);
      const std::uint64_t in_shard = start - dataset_.shard_start(s);
      const std::uint64_t take =
          std::min(count, dataset_.shard_start(s + 1) - start);  // up to the shard's end
      read_piece(s, in_shard, take, out, stats);
      start += take;
      count -= take;
      out += take;
    }
  }

  void close_all() { open_.clear(); }

 private:
  struct OpenShard {
    std::size_t index = 0;
    std::uint64_t last_use = 0;
    h5::Handle file;
    h5::Handle dataset;
    h5::Handle space;
  };

  std::size_t shard_of(std::uint64_t pos) const {
    std::size_t lo = 0;
    std::size_t hi = dataset_.shards().size();  // shard_start(hi) > pos
    while (hi - lo > 1) {
      const std::size_t mid = (lo + hi) / 2;
      if (dataset_.shard_start(mid) <= pos) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    return lo;
  }

  OpenShard& get(std::size_t s, BatchReaderStats& stats) {
    ++clock_;
    for (auto& o : open_) {
      if (o.index == s) {
        o.last_use = clock_;
        return o;
      }
    }
    if (open_.size() >= max_open_) {
      auto lru = std::min_element(open_.begin(), open_.end(), [](const auto& a, const auto& b) {
        return a.last_use < b.last_use;
      });
      open_.erase(lru);  // its handles close here
    }
    const ShardHeader& h = dataset_.shards()[s];
    const std::string where = shard_where(h.path);
    OpenShard o;
    o.index = s;
    o.last_use = clock_;
    // MPI_COMM_SELF: see the file comment of batch_reader.hpp.
    h5::Handle fapl(DST_H5_CHECK(H5Pcreate(H5P_FILE_ACCESS), where));
    DST_H5_CHECK(H5Pset_fapl_mpio(fapl.get(), MPI_COMM_SELF, MPI_INFO_NULL), where);
    o.file = h5::Handle(DST_H5_CHECK(H5Fopen(h.path.c_str(), H5F_ACC_RDONLY, fapl.get()), where));
    // No chunk cache: samples are read once per epoch in random order, so caching a whole
    // chunk (512 KiB by default) to use one sample's 2-8 KiB of it multiplies the bytes
    // read by ~100; without a cache HDF5 reads just the selected range of the chunk.
    h5::Handle dapl(DST_H5_CHECK(H5Pcreate(H5P_DATASET_ACCESS), where));
    DST_H5_CHECK(H5Pset_chunk_cache(dapl.get(), 0, 0, H5D_CHUNK_CACHE_W0_DEFAULT), where);
    o.dataset = h5::Handle(DST_H5_CHECK(H5Dopen2(o.file.get(), kTokensDataset, dapl.get()), where));
    o.space = h5::Handle(DST_H5_CHECK(H5Dget_space(o.dataset.get()), where));
    // The file may have been replaced since open_dataset checked it: the size read now
    // must still be the one the sample table was built from.
    hsize_t dims[1] = {0};
    if (DST_H5_CHECK(H5Sget_simple_extent_ndims(o.space.get()), where) != 1 ||
        (DST_H5_CHECK(H5Sget_simple_extent_dims(o.space.get(), dims, nullptr), where),
         dims[0] != h.num_tokens))
      throw DatasetError(where + ": dataset 'tokens' changed since the dataset was opened (" +
                         std::to_string(dims[0]) + " tokens, expected " +
                         std::to_string(h.num_tokens) + ")");
    if (!dxpl_.valid()) {
      dxpl_ = h5::Handle(DST_H5_CHECK(H5Pcreate(H5P_DATASET_XFER), where));
      // Independent: ranks read different samples at different times (batch_reader.hpp).
      DST_H5_CHECK(H5Pset_dxpl_mpio(dxpl_.get(), H5FD_MPIO_INDEPENDENT), where);
    }
    open_.push_back(std::move(o));
    ++stats.shard_opens;
    stats.max_open = std::max(stats.max_open, static_cast<int>(open_.size()));
    return open_.back();
  }

  void read_piece(std::size_t s, std::uint64_t first, std::uint64_t count, std::int32_t* out,
                  BatchReaderStats& stats) {
    OpenShard& o = get(s, stats);
    const ShardHeader& h = dataset_.shards()[s];
    const std::string where = shard_where(h.path);
    const hsize_t start[1] = {first};
    const hsize_t n[1] = {count};
    DST_H5_CHECK(H5Sselect_hyperslab(o.space.get(), H5S_SELECT_SET, start, nullptr, n, nullptr),
                 where);
    h5::Handle mem(DST_H5_CHECK(H5Screate_simple(1, n, nullptr), where));
    // HDF5 widens uint16/uint32 to int32; uint32 ids >= 2^31 saturate and fail below.
    DST_H5_CHECK(
        H5Dread(o.dataset.get(), H5T_NATIVE_INT32, mem.get(), o.space.get(), dxpl_.get(), out),
        where);
    ++stats.reads;
    // An id outside the vocabulary would index past the embedding table later; a cheap
    // scan of (count,) here turns a corrupt shard into an error naming it.
    const auto vocab = static_cast<std::int64_t>(h.vocab_size);
    for (std::uint64_t k = 0; k < count; ++k) {
      if (out[k] < 0 || out[k] >= vocab)
        throw DatasetError(where + ": token " + std::to_string(first + k) + " has id " +
                           std::to_string(out[k]) + ", outside the vocabulary of " +
                           std::to_string(h.vocab_size));
    }
  }

  const TokenDataset& dataset_;
  std::size_t max_open_;
  std::vector<OpenShard> open_;  // (<= max_open_,)
  h5::Handle dxpl_;
  std::uint64_t clock_ = 0;
};

struct Job {
  std::vector<std::uint64_t> ids;  // (B,)
};

struct Result {
  Batch batch;
  std::exception_ptr error;
};

}  // namespace

class BatchReader::Impl {
 public:
  Impl(const TokenDataset& dataset, BatchReaderOptions options)
      : dataset_(dataset), options_(options), cache_(dataset_, options.max_open_shards) {
    if (options_.prefetch) thread_ = std::thread([this] { run(); });
  }

  ~Impl() {
    if (thread_.joinable()) {
      {
        std::lock_guard<std::mutex> g(mutex_);
        stop_ = true;
      }
      queue_cv_.notify_all();
      thread_.join();  // the thread closes the files: it is the reader's HDF5 thread
    } else {
      h5::Lock lock;
      cache_.close_all();
    }
  }

  void request(std::vector<std::uint64_t> ids) {
    for (const auto id : ids) {
      if (id >= dataset_.num_samples())
        throw DatasetError("dataset '" + dataset_.shards().front().path + "': sample id " +
                           std::to_string(id) + " is outside [0, " +
                           std::to_string(dataset_.num_samples()) + ")");
    }
    {
      std::lock_guard<std::mutex> g(mutex_);
      queue_.push_back(Job{std::move(ids)});
      ++outstanding_;
    }
    queue_cv_.notify_one();
  }

  Batch wait() {
    Result r;
    if (options_.prefetch) {
      std::unique_lock<std::mutex> g(mutex_);
      DST_REQUIRE(outstanding_ > 0, "BatchReader::wait: no request is outstanding");
      done_cv_.wait(g, [this] { return !done_.empty(); });
      r = std::move(done_.front());
      done_.pop_front();
      --outstanding_;
    } else {
      Job job;
      {
        std::lock_guard<std::mutex> g(mutex_);
        DST_REQUIRE(outstanding_ > 0, "BatchReader::wait: no request is outstanding");
        job = std::move(queue_.front());
        queue_.pop_front();
        --outstanding_;
      }
      r = serve(std::move(job));
    }
    if (r.error) std::rethrow_exception(r.error);
    return std::move(r.batch);
  }

  std::size_t outstanding() const {
    std::lock_guard<std::mutex> g(mutex_);
    return outstanding_;
  }

  BatchReaderStats stats() const {
    std::lock_guard<std::mutex> g(mutex_);
    return stats_;
  }

 private:
  void run() {
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> g(mutex_);
        queue_cv_.wait(g, [this] { return stop_ || !queue_.empty(); });
        if (stop_) break;
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      Result r = serve(std::move(job));
      {
        std::lock_guard<std::mutex> g(mutex_);
        done_.push_back(std::move(r));
      }
      done_cv_.notify_all();
    }
    h5::Lock lock;
    cache_.close_all();
  }

  // Reads one request. Runs on the prefetch thread (or the caller's, without prefetch).
  Result serve(Job job) {
    Result r;
    r.batch.seq_len = dataset_.seq_len();
    r.batch.sample_ids = std::move(job.ids);
    try {
      if (options_.inject_read_delay_ms > 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(options_.inject_read_delay_ms));
      const std::size_t cols = r.batch.cols();
      r.batch.tokens.resize(r.batch.rows() * cols);  // (B, T+1)
      BatchReaderStats delta;
      {
        h5::Lock lock;
        for (std::size_t b = 0; b < r.batch.rows(); ++b) {
          const std::uint64_t start =
              r.batch.sample_ids[b] * static_cast<std::uint64_t>(dataset_.seq_len());
          cache_.read_stream(start, cols, r.batch.tokens.data() + b * cols, delta);
        }
      }
      std::lock_guard<std::mutex> g(mutex_);
      stats_.requests += 1;
      stats_.reads += delta.reads;
      stats_.shard_opens += delta.shard_opens;
      stats_.max_open = std::max(stats_.max_open, delta.max_open);
    } catch (...) {
      r.error = std::current_exception();
    }
    return r;
  }

  TokenDataset dataset_;
  BatchReaderOptions options_;
  ShardCache cache_;  // used by one thread only: the prefetch thread, or the caller
  mutable std::mutex mutex_;
  std::condition_variable queue_cv_;
  std::condition_variable done_cv_;
  std::deque<Job> queue_;
  std::deque<Result> done_;
  std::size_t outstanding_ = 0;
  BatchReaderStats stats_;
  bool stop_ = false;
  std::thread thread_;
};

BatchReader::BatchReader(const TokenDataset& dataset, BatchReaderOptions options) {
  DST_REQUIRE(options.max_open_shards >= 1,
              "BatchReader: max_open_shards must be at least 1, got " << options.max_open_shards);
  DST_REQUIRE(options.inject_read_delay_ms >= 0,
              "BatchReader: inject_read_delay_ms must not be negative, got "
                  << options.inject_read_delay_ms);
  DST_REQUIRE(dataset.num_samples() > 0, "BatchReader: the dataset holds no sample");
  int initialized = 0;
  DST_MPI_CHECK(MPI_Initialized(&initialized));
  DST_REQUIRE(initialized, "BatchReader: MPI must be initialised (shards are read with MPI-IO)");
  if (options.prefetch) {
    int level = MPI_THREAD_SINGLE;
    DST_MPI_CHECK(MPI_Query_thread(&level));
    DST_REQUIRE(level >= MPI_THREAD_MULTIPLE,
                "BatchReader: prefetching reads with MPI-IO on a background thread while the "
                "training thread runs collectives, which needs MPI_THREAD_MULTIPLE; MPI "
                "provides level "
                    << level << " (use prefetch = false, or an MPI with thread support)");
  }
  impl_ = std::make_unique<Impl>(dataset, options);
}

BatchReader::~BatchReader() = default;

void BatchReader::request(std::vector<std::uint64_t> sample_ids) {
  impl_->request(std::move(sample_ids));
}
Batch BatchReader::wait() {
  return impl_->wait();
}
std::size_t BatchReader::outstanding() const {
  return impl_->outstanding();
}
BatchReaderStats BatchReader::stats() const {
  return impl_->stats();
}

}  // namespace dst::data
