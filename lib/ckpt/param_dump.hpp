#pragma once
/// \file param_dump.hpp
/// The parameters as a plain HDF5 file of named tensors (/params/<state-dict name>, f32,
/// the tensor's shape; attribute `step`), readable with h5py and loadable into Hugging
/// Face's LlamaForCausalLM. Written at the end of a run (`final-params.h5`), and by tests
/// comparing runs. Collective checkpoints (optimizer state, data position) are the ckpt
/// layer's; this is the model alone.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ckpt/checkpoint.hpp"

namespace dst::ckpt {

/// Writes `path` (via `path.tmp` and a rename, so a partial file never has the name) from
/// tensors produced one at a time: `tensors` names them ("params/<name>") with their
/// shapes, `source(i)` returns tensor i whole (called in order on every rank: it may be
/// collective, Trainer::checkpoint_stream). Every rank calls this; the `writer` rank
/// writes the file with serial HDF5 (holding h5::Lock), and throws dst::Error naming the
/// file and the failed HDF5 call on failure, leaving no file behind. A failure on the writer is
/// thrown after every tensor has been produced, so that the other ranks are not left inside a
/// collective.
void write_parameters_h5(const std::string& path, const std::vector<ckpt::TensorRef>& tensors,
                         const std::function<const float*(std::size_t)>& source, std::int64_t step,
                         bool writer);

}  // namespace dst::ckpt
