// Tokenizer encoding throughput on the parity corpus (tests/data/tokenizer/corpus.txt):
// the byte-level tokenizer, and byte-level BPE for each --tokenizer=PATH given (by
// default the tiny test model; pass DeepSeek-V3's or 7B's tokenizer.json to compare
// with hf_tokenizers_speed.py, which times Hugging Face tokenizers on the same file).
//
//   tokenizer_benchmark [--corpus=PATH] [--tokenizer=PATH ...] [--benchmark_* flags]
//
// Whole-file encode, one thread, repeated: the per-thread word cache is warm after the
// first iteration, as the reference's is.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "data/tokenizer/bpe_tokenizer.hpp"
#include "data/tokenizer/byte_tokenizer.hpp"

namespace {

void encode(benchmark::State& state, const dst::data::Tokenizer* tok, const std::string* text) {
  std::vector<dst::data::TokenId> ids;
  for (auto _ : state) {
    ids.clear();
    tok->encode_into(*text, ids);
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(text->size() * state.iterations()));
  state.counters["MB_per_s"] = benchmark::Counter(static_cast<double>(text->size()) * 1e-6,
                                                  benchmark::Counter::kIsIterationInvariantRate);
  state.counters["tokens"] = static_cast<double>(ids.size());
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  std::string corpus_path = DSTRAIN_TOKENIZER_CORPUS;
  std::vector<std::string> paths;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--corpus=", 0) == 0) {
      corpus_path = a.substr(9);
    } else if (a.rfind("--tokenizer=", 0) == 0) {
      paths.push_back(a.substr(12));
    } else {
      std::fprintf(stderr, "tokenizer_benchmark: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (paths.empty()) paths.push_back(DSTRAIN_TOKENIZER_TINY);
  std::ifstream in(corpus_path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "tokenizer_benchmark: cannot read %s\n", corpus_path.c_str());
    return 1;
  }
  static const std::string text{std::istreambuf_iterator<char>(in),
                                std::istreambuf_iterator<char>()};
  static std::vector<std::unique_ptr<dst::data::Tokenizer>> toks;
  toks.push_back(dst::data::make_byte_tokenizer());
  benchmark::RegisterBenchmark("BM_encode/byte", encode, toks.back().get(), &text);
  for (const auto& p : paths) {
    toks.push_back(dst::data::BpeTokenizer::from_file(p));
    // Name by the tokenizer's folder ("deepseek-v3") or file.
    std::string name = p;
    const auto slash = name.find_last_of('/');
    if (slash != std::string::npos && name.substr(slash + 1) == "tokenizer.json") {
      name.erase(slash);
    }
    name = name.substr(name.find_last_of('/') + 1);
    benchmark::RegisterBenchmark(("BM_encode/" + name).c_str(), encode, toks.back().get(), &text);
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
