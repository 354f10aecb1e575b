#pragma once
/// \file safetensors.hpp
/// The safetensors format (https://github.com/huggingface/safetensors, "Format"), the
/// export format of `dstrain export`:
///   8 bytes   N, the header's length, unsigned little-endian
///   N bytes   a UTF-8 JSON object: "__metadata__" (string to string; we always write
///             "format": "pt") and, per tensor, {"dtype": "F32"|"BF16", "shape": [...],
///             "data_offsets": [begin, end]} relative to the byte buffer; padded with
///             spaces so that 8 + N is a multiple of 8 (the data then starts aligned)
///   rest      the byte buffer: the tensors' little-endian bytes, row-major, back to back
///             in the order given, with no holes (the format requires it).

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dst::ckpt {

/// The element type a tensor is stored as. Inputs are always f32; bf16 rounds to nearest
/// even (core/bf16.hpp).
enum class StDType { f32, bf16 };

/// "F32" or "BF16", the format's dtype names.
const char* safetensors_dtype_name(StDType d);

/// A tensor to write: its name (a state-dict key), shape and f32 data.
struct StTensor {
  std::string name;
  std::vector<std::int64_t> shape;
  const float* data = nullptr;
};

/// Writes `path` (through `path`.tmp and a rename, so a reader never sees half a file).
/// `metadata` is added to "__metadata__" next to "format": "pt". Returns the file size.
/// Throws dst::Error naming the file on an I/O failure, a duplicate or empty name, or a
/// negative dimension.
std::uint64_t write_safetensors(const std::string& path, const std::vector<StTensor>& tensors,
                                StDType dtype,
                                const std::map<std::string, std::string>& metadata = {});

/// One tensor of a safetensors file as its header describes it.
struct StEntry {
  std::string name;
  std::string dtype;  ///< "F32", "BF16", ...
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  ///< data_offsets, relative to the byte buffer
};

/// A safetensors file's header, checked against the format: the length prefix, the JSON,
/// every entry's fields, offsets that tile the byte buffer exactly (no holes, no
/// overlap) with sizes matching dtype x shape.
struct StHeader {
  std::uint64_t header_bytes = 0;  ///< N
  std::map<std::string, std::string> metadata;
  std::vector<StEntry> tensors;  ///< in the order of their offsets
};

/// Reads and checks the header of `path`; throws dst::Error naming the file and the rule.
StHeader read_safetensors_header(const std::string& path);

/// Reads tensor `name` of `path` as f32 (F32 or BF16 entries). Throws dst::Error.
std::vector<float> read_safetensors_tensor(const std::string& path, const StHeader& header,
                                           const std::string& name);

}  // namespace dst::ckpt
