#pragma once
/// \file hdf5_store.hpp
/// A SampleStore over HDF5 token shards (docs/dataset.md): samples read by a
/// BatchReader, with the next optimizer step's samples read ahead while this one
/// computes.

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "data/dataset/batch_reader.hpp"
#include "data/dataset/sampler.hpp"
#include "data/dataset/token_dataset.hpp"
#include "train/trainer.hpp"

namespace dst::train {

/// Serves read(ids) from a BatchReader. Without follow() every read is a request and a
/// wait. With follow(sampler), the store keeps its own copy of the training sampler (a
/// pure function of seed and position) and requests the samples of the step after the
/// one being read as soon as that one is handed out, so with prefetching the reads of
/// step k+1 overlap the forward/backward of step k and the data phase only copies.
/// A read that differs from the prediction (e.g. an evaluation through the same store)
/// is served correctly: the outstanding predictions are drained and read-ahead stops.
class Hdf5SampleStore final : public SampleStore {
 public:
  Hdf5SampleStore(const data::TokenDataset& dataset, data::BatchReaderOptions options);
  ~Hdf5SampleStore() override;

  std::uint64_t num_samples() const override { return dataset_.num_samples(); }
  /// out: (ids.size(), seq_len + 1). Throws DatasetError from the reader.
  void read(const std::vector<std::uint64_t>& ids, std::int32_t* out) override;

  /// Reads ahead what `sampler` (copied, at its current position) will ask for, for at
  /// most `max_steps` steps (nothing is read for steps that will not run, so no read is
  /// in flight when training ends).
  void follow(const data::Sampler& sampler, std::int64_t max_steps);

  const data::TokenDataset& dataset() const { return dataset_; }
  data::BatchReaderStats stats() const { return reader_.stats(); }

 private:
  void request_next_step();

  data::TokenDataset dataset_;
  data::BatchReader reader_;
  std::unique_ptr<data::Sampler> lookahead_;
  std::int64_t steps_left_ = 0;                     // steps lookahead_ may still request
  std::deque<std::vector<std::uint64_t>> pending_;  // requests outstanding in reader_
};

/// The first samples' tokens of `dataset` as one stream (at most `max_tokens`, rounded
/// down to whole samples), read through a BatchReader: for statistics such as the
/// bigram baseline. Serial (no prefetch); call it on one rank.
std::vector<std::int32_t> read_token_stream(const data::TokenDataset& dataset,
                                            std::uint64_t max_tokens);

}  // namespace dst::train
