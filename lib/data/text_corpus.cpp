#include "data/text_corpus.hpp"

#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.hpp"
#include "data/byte_vocab.hpp"

namespace dst::data {

namespace {

void append_document(std::vector<std::int32_t>& stream, const std::string& text) {
  for (const unsigned char c : text)
    stream.push_back(static_cast<std::int32_t>(c));
  stream.push_back(kByteEos);
}

std::vector<std::string> read_documents(const std::vector<std::string>& paths,
                                        const std::string& separator) {
  std::vector<std::string> docs;
  for (const auto& path : paths) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error("text corpus: cannot read '" + path + "'");
    if (separator.empty()) {
      std::ostringstream all;
      all << in.rdbuf();
      docs.push_back(all.str());
    } else {
      std::string line, doc;
      while (std::getline(in, line)) {
        if (line == separator) {
          if (!doc.empty()) docs.push_back(std::move(doc));
          doc.clear();
        } else {
          doc += line;
          doc += '\n';
        }
      }
      if (!doc.empty()) docs.push_back(std::move(doc));
    }
    if (in.bad()) throw Error("text corpus: error while reading '" + path + "'");
  }
  return docs;
}

}  // namespace

TextCorpus load_text_corpus(const std::vector<std::string>& paths, const std::string& separator,
                            int valid_every) {
  if (valid_every < 2)
    throw Error("text corpus: valid_every must be >= 2, got " + std::to_string(valid_every));
  TextCorpus corpus;
  const auto docs = read_documents(paths, separator);
  for (std::size_t i = 0; i < docs.size(); ++i) {
    corpus.bytes += static_cast<std::int64_t>(docs[i].size());
    const bool held_out = (i + 1) % static_cast<std::size_t>(valid_every) == 0;
    append_document(held_out ? corpus.valid : corpus.train, docs[i]);
  }
  corpus.documents = static_cast<std::int64_t>(docs.size());
  return corpus;
}

std::vector<std::int32_t> load_text_stream(const std::vector<std::string>& paths,
                                           const std::string& separator, std::int64_t* documents) {
  const auto docs = read_documents(paths, separator);
  std::vector<std::int32_t> stream;
  for (const auto& d : docs)
    append_document(stream, d);
  if (documents) *documents = static_cast<std::int64_t>(docs.size());
  return stream;
}

std::int64_t sample_count(const std::vector<std::int32_t>& stream, std::int64_t seq_len) {
  if (seq_len < 1) return 0;
  const auto n = static_cast<std::int64_t>(stream.size());
  return n > seq_len ? (n - 1) / seq_len : 0;
}

void copy_sample(const std::vector<std::int32_t>& stream, std::int64_t seq_len, std::uint64_t index,
                 std::int32_t* out) {
  const auto begin = static_cast<std::size_t>(index) * static_cast<std::size_t>(seq_len);
  if (begin + static_cast<std::size_t>(seq_len) + 1 > stream.size())
    throw Error("text corpus: sample " + std::to_string(index) + " is past the end of the stream");
  std::memcpy(out, stream.data() + begin,
              (static_cast<std::size_t>(seq_len) + 1) * sizeof(std::int32_t));
}

}  // namespace dst::data
