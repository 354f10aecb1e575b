#pragma once
/// \file format.hpp
/// Names in a checkpoint file (docs/checkpoint.md, "layout"), shared by writer and reader.

#include <cstdint>

namespace dst::ckpt::detail {

/// Root attribute `format`: what the file is.
inline constexpr const char* kFormatName = "dstrain-checkpoint";
/// Group of the non-tensor datasets (the deck); no tensor may live under it.
inline constexpr const char* kMetaGroup = "meta";
inline constexpr const char* kDeckDataset = "meta/deck_yaml";
/// The run's tokenizer.json, when it has one.
inline constexpr const char* kTokenizerJsonDataset = "meta/tokenizer_json";
/// Per-dataset attribute holding tensor_checksum() of the tensor.
inline constexpr const char* kChecksumAttr = "checksum_xxh64";

/// Most elements moved by one H5Dwrite/H5Dread or one broadcast: 2^28 floats = 1 GiB,
/// safely below MPI's int counts (2^31 - 1) and the 2 GiB single-transfer limits that
/// older MPI-IO and HDF5 releases have.
inline constexpr std::uint64_t kMaxPieceElements = std::uint64_t{1} << 28;

}  // namespace dst::ckpt::detail
