#pragma once
/// \file text_corpus.hpp
/// A small corpus held in memory: text files encoded with the byte-level vocabulary
/// (byte_vocab.hpp), each document followed by EOS, split into training and validation
/// token streams. It serves small runs and the demo directly from text; large corpora go
/// through `dstrain prep` into HDF5 shards.
///
/// Sample i of a stream is tokens [i * T, i * T + T + 1): T inputs and, shifted by one,
/// T targets. Samples may cross document boundaries (separated by EOS), as in the HDF5
/// datasets.

#include <cstdint>
#include <string>
#include <vector>

namespace dst::data {

struct TextCorpus {
  std::vector<std::int32_t> train;  ///< token stream
  std::vector<std::int32_t> valid;
  std::int64_t documents = 0;
  std::int64_t bytes = 0;
};

/// Reads `paths` (files; each line of `separator_lines`-separated files is not split:
/// one file = one document, or documents separated by lines equal to `separator`, if
/// not empty) and holds out every `valid_every`-th document (by order) for validation.
/// Throws dst::Error naming a file that cannot be read.
TextCorpus load_text_corpus(const std::vector<std::string>& paths, const std::string& separator,
                            int valid_every);

/// Reads `paths` as one byte-level token stream: every document followed by EOS, one
/// document per file, or documents separated by lines equal to `separator` if it is not
/// empty. Throws dst::Error naming a file that cannot be read.
std::vector<std::int32_t> load_text_stream(const std::vector<std::string>& paths,
                                           const std::string& separator,
                                           std::int64_t* documents = nullptr);

/// Number of full samples of length seq_len (+1 target) in a stream.
std::int64_t sample_count(const std::vector<std::int32_t>& stream, std::int64_t seq_len);

/// Copies sample `index` of `stream` into out[0 .. seq_len] (seq_len + 1 tokens).
void copy_sample(const std::vector<std::int32_t>& stream, std::int64_t seq_len, std::uint64_t index,
                 std::int32_t* out);

}  // namespace dst::data
