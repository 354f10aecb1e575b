#include "data/sample_store.hpp"

#include "core/error.hpp"
#include "core/flight_recorder.hpp"

namespace dst::data {

BatchSource::BatchSource(SampleStore& store, const SamplerConfig& config, std::int64_t seq_len)
    : store_(store), sampler_(config), seq_len_(seq_len) {}

void BatchSource::next_step(std::int32_t* out) {
  const auto ids = sampler_.next_step();  // (micro_batches, micro_batch_size)
  promised_ = false;
  const std::size_t micro_len = static_cast<std::size_t>(sampler_.config().micro_batch_size) *
                                static_cast<std::size_t>(seq_len_ + 1);
  {
    core::FlightScope scope("read the step's samples");
    for (std::size_t m = 0; m < ids.size(); ++m)
      store_.read(ids[m], out + m * micro_len);
  }
  promise_next_step();
}

void BatchSource::read_ahead(std::int64_t steps) {
  if (steps < 0) throw Error("BatchSource: read-ahead of " + std::to_string(steps) + " steps");
  ahead_left_ = steps;
  if (!promised_) promise_next_step();
}

void BatchSource::seek(SamplePosition pos) {
  if (promised_)
    throw Error("BatchSource: seek after the next step's samples were promised to the store");
  sampler_.seek(pos);
}

void BatchSource::promise_next_step() {
  if (ahead_left_ <= 0) return;
  --ahead_left_;
  for (const auto& micro : sampler_.rank_step(sampler_.position()))
    store_.prefetch(micro);
  promised_ = true;
}

}  // namespace dst::data
