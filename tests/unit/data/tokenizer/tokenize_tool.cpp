// tokenize_tool: the C++ side of tests/oracle/tokenizer_parity.py (and a quick timer).
// Independent of the dstrain executable so that the parity test exercises the library.
//
//   tokenize_tool (--byte | --tokenizer PATH) encode FILE        ids of the whole file, one line
//   tokenize_tool (--byte | --tokenizer PATH) encode-lines FILE  ids of each '\n'-ended line
//   tokenize_tool (--byte | --tokenizer PATH) roundtrip FILE     decode(encode(file)) == file?
//   tokenize_tool (--byte | --tokenizer PATH) time FILE SECONDS  whole-file encode MB/s
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/tokenizer/bpe_tokenizer.hpp"
#include "data/tokenizer/byte_tokenizer.hpp"

namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void print_ids(const std::vector<dst::data::TokenId>& ids) {
  std::string line;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i) line += ' ';
    line += std::to_string(ids[i]);
  }
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), stdout);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::vector<std::string> a(argv + 1, argv + argc);
    if (a.size() < 3) {
      std::fprintf(stderr,
                   "usage: tokenize_tool (--byte | --tokenizer PATH) MODE FILE [SECONDS]\n");
      return 2;
    }
    std::unique_ptr<dst::data::Tokenizer> tok;
    std::size_t k = 0;
    if (a[0] == "--byte") {
      tok = dst::data::make_byte_tokenizer();
      k = 1;
    } else if (a[0] == "--tokenizer") {
      tok = dst::data::BpeTokenizer::from_file(a[1]);
      k = 2;
    }
    const std::string mode = a.at(k), text = read_all(a.at(k + 1));
    if (mode == "encode") {
      print_ids(tok->encode(text));
    } else if (mode == "encode-lines") {
      for (std::size_t b = 0; b < text.size();) {
        std::size_t e = text.find('\n', b);
        e = e == std::string::npos ? text.size() : e + 1;
        print_ids(tok->encode(std::string_view(text).substr(b, e - b)));
        b = e;
      }
    } else if (mode == "roundtrip") {
      const auto ids = tok->encode(text);
      const std::string back = tok->decode(ids);
      if (back != text) {
        std::size_t i = 0;
        while (i < back.size() && i < text.size() && back[i] == text[i])
          ++i;
        std::printf("roundtrip MISMATCH at byte %zu of %zu\n", i, text.size());
        return 1;
      }
      std::printf("roundtrip ok: %zu bytes, %zu tokens\n", text.size(), ids.size());
    } else if (mode == "time") {
      const double seconds = std::stod(a.at(k + 2));
      std::vector<dst::data::TokenId> ids;
      const auto t0 = std::chrono::steady_clock::now();
      double elapsed = 0;
      long n = 0;
      do {
        ids.clear();
        tok->encode_into(text, ids);
        ++n;
        elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      } while (elapsed < seconds);
      std::printf("%.2f MB/s (%ld encodes of %zu bytes, %zu tokens)\n",
                  1e-6 * static_cast<double>(text.size()) * n / elapsed, n, text.size(),
                  ids.size());
    } else {
      std::fprintf(stderr, "tokenize_tool: unknown mode %s\n", mode.c_str());
      return 2;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tokenize_tool: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
