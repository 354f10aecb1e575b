#include "train/hdf5_store.hpp"

#include <algorithm>
#include <cstring>

namespace dst::train {

Hdf5SampleStore::Hdf5SampleStore(const data::TokenDataset& dataset,
                                 data::BatchReaderOptions options)
    : dataset_(dataset), reader_(dataset_, options) {}

Hdf5SampleStore::~Hdf5SampleStore() = default;

void Hdf5SampleStore::follow(const data::Sampler& sampler, std::int64_t max_steps) {
  lookahead_ = std::make_unique<data::Sampler>(sampler);
  steps_left_ = max_steps;
  if (pending_.empty()) request_next_step();
}

void Hdf5SampleStore::request_next_step() {
  if (!lookahead_ || steps_left_ <= 0) return;
  --steps_left_;
  for (auto& micro : lookahead_->next_step()) {  // (micro_batches, micro_batch_size)
    reader_.request(micro);
    pending_.push_back(std::move(micro));
  }
}

void Hdf5SampleStore::read(const std::vector<std::uint64_t>& ids, std::int32_t* out) {
  data::Batch batch;
  if (!pending_.empty() && pending_.front() == ids) {
    batch = reader_.wait();
    pending_.pop_front();
  } else {
    // Not what was predicted: drop the read-ahead (requests are served in order).
    while (!pending_.empty()) {
      reader_.wait();
      pending_.pop_front();
    }
    lookahead_.reset();
    reader_.request(ids);
    batch = reader_.wait();
  }
  std::memcpy(out, batch.tokens.data(), batch.tokens.size() * sizeof(std::int32_t));
  // The trainer reads a step's micro-batches back to back: once the last is handed
  // out, the next step is read while this one computes.
  if (pending_.empty()) request_next_step();
}

std::vector<std::int32_t> read_token_stream(const data::TokenDataset& dataset,
                                            std::uint64_t max_tokens) {
  data::BatchReaderOptions o;
  o.prefetch = false;
  data::BatchReader reader(dataset, o);
  const std::uint64_t T = static_cast<std::uint64_t>(dataset.seq_len());
  const std::uint64_t samples = std::min(dataset.num_samples(), max_tokens / T);
  std::vector<std::int32_t> stream;
  stream.reserve(samples * T + 1);
  // Sample i is tokens [i*T, i*T + T + 1): consecutive samples share one token, so the
  // stream is sample 0 and then the last T tokens of each following sample.
  constexpr std::uint64_t kBatch = 256;  // samples per read: a few MB at most
  for (std::uint64_t first = 0; first < samples; first += kBatch) {
    std::vector<std::uint64_t> ids;
    for (std::uint64_t i = first; i < std::min(samples, first + kBatch); ++i)
      ids.push_back(i);
    reader.request(ids);
    const data::Batch b = reader.wait();
    for (std::size_t r = 0; r < b.rows(); ++r) {
      const std::int32_t* row = b.row(r);
      stream.insert(stream.end(), row + (stream.empty() ? 0 : 1), row + b.cols());
    }
  }
  return stream;
}

}  // namespace dst::train
