#include "data/hdf5_store.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/error.hpp"

namespace dst::data {

Hdf5SampleStore::Hdf5SampleStore(const TokenDataset& dataset, BatchReaderOptions options)
    : dataset_(dataset), reader_(dataset_, options) {}

Hdf5SampleStore::~Hdf5SampleStore() = default;

void Hdf5SampleStore::prefetch(const std::vector<std::uint64_t>& ids) {
  reader_.request(ids);
  pending_.push_back(ids);
}

void Hdf5SampleStore::read(const std::vector<std::uint64_t>& ids, std::int32_t* out) {
  if (pending_.empty()) {
    reader_.request(ids);
  } else if (pending_.front() != ids) {
    throw Error("Hdf5SampleStore: read of " + std::to_string(ids.size()) +
                " samples that are not the next promised ones (reads must follow prefetches)");
  } else {
    pending_.pop_front();
  }
  const Batch batch = reader_.wait();
  std::memcpy(out, batch.tokens.data(), batch.tokens.size() * sizeof(std::int32_t));
}

std::vector<std::int32_t> read_token_stream(const TokenDataset& dataset, std::uint64_t max_tokens) {
  BatchReaderOptions o;
  o.prefetch = false;
  BatchReader reader(dataset, o);
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
    const Batch b = reader.wait();
    for (std::size_t r = 0; r < b.rows(); ++r) {
      const std::int32_t* row = b.row(r);
      stream.insert(stream.end(), row + (stream.empty() ? 0 : 1), row + b.cols());
    }
  }
  return stream;
}

}  // namespace dst::data
