// Helper of check_dataset_h5py.py: writes shards with dstrain's ShardWriter, and
// validates shards written by anything else, so the format can be checked from both
// sides with h5py.
//
//   dataset_shards write DIR      DIR/bytes.h5 (vocab 260, uint16) and DIR/wide.h5
//                                 (vocab 100000, uint32) from the formulas below
//   dataset_shards validate PATH  validate_shard(PATH, full); prints "valid: ..." or
//                                 "invalid: <message>" (exit 1)
//
// Corpus (mirrored in check_dataset_h5py.py): document d has 1 + (37 d mod 23) tokens;
// token j is (131 d + 17 j) mod 256 in bytes.h5 (documents 0..299) and
// (131 d + 17 j) * 389 mod 99999 in wide.h5 (documents 0..49).
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "data/dataset/shard_writer.hpp"
#include "dataset_test_util.hpp"

namespace {

int write(const std::string& dir) {
  using namespace dst::data;
  test::write_corpus_shard(dir + "/bytes.h5", 0, 300, test::byte_options(64));
  ShardWriterOptions wide;
  wide.vocab_size = 100000;
  wide.eos_id = 99999;
  wide.tokenizer = {"wide-test", definition_hash("wide test vocabulary")};
  wide.chunk_tokens = 100;
  ShardWriter w(dir + "/wide.h5", wide);
  for (std::uint64_t d = 0; d < 50; ++d) {
    auto doc = test::corpus_document(d);
    for (std::size_t j = 0; j < doc.size(); ++j)
      doc[j] = static_cast<std::int32_t>(((131 * d + 17 * j) * 389) % 99999);
    w.append_document(doc);
  }
  w.close();
  std::printf("wrote %s/bytes.h5 %s/wide.h5\n", dir.c_str(), dir.c_str());
  return 0;
}

int validate(const std::string& path) {
  try {
    const auto h = dst::data::validate_shard(path, dst::data::ShardCheck::full);
    std::printf("valid: %s tokens=%llu documents=%llu token_bytes=%d tokenizer=%s\n", path.c_str(),
                static_cast<unsigned long long>(h.num_tokens),
                static_cast<unsigned long long>(h.num_documents), h.token_bytes,
                h.tokenizer.name.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::printf("invalid: %s\n", e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "write") == 0) return write(argv[2]);
  if (argc == 3 && std::strcmp(argv[1], "validate") == 0) return validate(argv[2]);
  std::fprintf(stderr, "usage: dataset_shards write DIR | validate PATH\n");
  return 2;
}
