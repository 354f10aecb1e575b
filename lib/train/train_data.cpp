#include "train/train_data.hpp"

#include <glob.h>

#include <utility>
#include <vector>

#include "core/error.hpp"
#include "core/exit_codes.hpp"
#include "data/byte_vocab.hpp"
#include "data/dataset/token_dataset.hpp"
#include "data/text_corpus.hpp"
#include "data/text_store.hpp"
#include "train/baseline.hpp"

namespace dst::train {

namespace {

/// data.train / data.valid: comma-separated paths, each may be a glob.
std::vector<std::string> expand_paths(const std::string& spec, const char* key) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= spec.size()) {
    const std::size_t comma = spec.find(',', start);
    const std::string item =
        spec.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) {
      glob_t g{};
      const int rc = ::glob(item.c_str(), 0, nullptr, &g);
      if (rc == 0) {
        for (std::size_t i = 0; i < g.gl_pathc; ++i)
          out.emplace_back(g.gl_pathv[i]);
      } else {
        globfree(&g);
        throw DeckError(key, "", "no file matches '" + item + "'");
      }
      globfree(&g);
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (out.empty()) throw DeckError(key, "", "no data files given");
  return out;
}

bool is_text(const config::DataSection& d) {
  if (d.format != config::DataFormat::automatic) return d.format == config::DataFormat::text;
  return d.train.size() >= 4 && d.train.compare(d.train.size() - 4, 4, ".txt") == 0;
}

}  // namespace

TrainData TrainData::open(runtime::Runtime& rt, const config::RunConfig& cfg,
                          const config::Layout& layout, int read_delay_ms) {
  TrainData d;
  std::string problem;
  try {
    if (cfg.data.train.empty()) throw DeckError("data.train", "", "no training data configured");
    if (is_text(cfg.data)) {
      if (cfg.model.vocab_size < data::kByteVocabSize)
        throw DeckError("model.vocab_size", "",
                        "text data uses the byte-level vocabulary of " +
                            std::to_string(data::kByteVocabSize) + " tokens; got " +
                            std::to_string(cfg.model.vocab_size));
      std::int64_t docs = 0;
      auto train_tokens = data::load_text_stream(expand_paths(cfg.data.train, "data.train"),
                                                 cfg.data.text_separator, &docs);
      std::vector<std::int32_t> valid_tokens;
      if (!cfg.data.valid.empty())
        valid_tokens = data::load_text_stream(expand_paths(cfg.data.valid, "data.valid"),
                                              cfg.data.text_separator);
      d.train_docs = static_cast<std::uint64_t>(docs);
      d.tokenizer_name = "byte260";
      d.train_tokens = train_tokens.size();
      d.valid_tokens = valid_tokens.size();
      d.train = std::make_unique<data::TextSampleStore>(std::move(train_tokens), cfg.data.seq_len);
      d.valid = std::make_unique<data::TextSampleStore>(std::move(valid_tokens), cfg.data.seq_len);
    } else {
      // The reader's thread calls MPI-IO while this one runs collectives: prefetch only
      // when MPI allows that (the runtime asks for MPI_THREAD_MULTIPLE).
      data::BatchReaderOptions ro;
      ro.prefetch = rt.thread_level() == "multiple";
      ro.inject_read_delay_ms = read_delay_ms;
      const int T = static_cast<int>(cfg.data.seq_len);
      const data::TokenDataset train_ds =
          data::open_dataset(rt.world(), cfg.data.train, T, cfg.parallel.init_timeout_s);
      if (train_ds.vocab_size() > static_cast<std::uint64_t>(cfg.model.vocab_size))
        throw DeckError("model.vocab_size", "",
                        "is " + std::to_string(cfg.model.vocab_size) + " but the shards of '" +
                            cfg.data.train + "' (tokenizer " + train_ds.tokenizer().name +
                            ") use " + std::to_string(train_ds.vocab_size()) + " ids");
      d.tokenizer_name = train_ds.tokenizer().name;
      for (const auto& h : train_ds.shards())
        d.train_docs += h.num_documents;
      d.train_tokens = train_ds.num_tokens();
      auto train = std::make_unique<data::Hdf5SampleStore>(train_ds, ro);
      d.train_h5_ = train.get();
      d.train = std::move(train);
      if (!cfg.data.valid.empty()) {
        const data::TokenDataset valid_ds =
            data::open_dataset(rt.world(), cfg.data.valid, T, cfg.parallel.init_timeout_s);
        if (!(valid_ds.tokenizer() == train_ds.tokenizer()))
          throw DeckError("data.valid", "",
                          "tokenizer " + valid_ds.tokenizer().name + " (" +
                              valid_ds.tokenizer().hash + ") differs from data.train's " +
                              train_ds.tokenizer().name + " (" + train_ds.tokenizer().hash + ")");
        d.valid_tokens = valid_ds.num_tokens();
        // Evaluation reads a few batches at a time and waits for them: no read-ahead.
        data::BatchReaderOptions vo = ro;
        vo.prefetch = false;
        auto valid = std::make_unique<data::Hdf5SampleStore>(valid_ds, vo);
        d.valid_h5_ = valid.get();
        d.valid = std::move(valid);
      } else {
        d.valid =
            std::make_unique<data::TextSampleStore>(std::vector<std::int32_t>{}, cfg.data.seq_len);
      }
    }
    const auto samples = d.train->num_samples();
    if (samples < static_cast<std::uint64_t>(layout.global_batch_size))
      throw DeckError("data.train", "",
                      "has " + std::to_string(samples) + " samples of " +
                          std::to_string(cfg.data.seq_len) +
                          " tokens, fewer than one global batch (" +
                          std::to_string(layout.global_batch_size) + ")");
  } catch (const Error& e) {
    problem = e.what();
  }
  runtime::agree_or_fail(rt.world(), problem.empty(), "cannot load the training data: " + problem,
                         kExitDeck, cfg.parallel.init_timeout_s, "data");
  return d;
}

std::optional<double> TrainData::bigram_baseline(std::int64_t vocab_size, bool root,
                                                 std::string& note) const {
  if (!root) return std::nullopt;
  const auto vocab = static_cast<std::int32_t>(vocab_size);
  if (!train_h5_) {
    const auto& t = static_cast<const data::TextSampleStore&>(*train).stream();
    const auto& v = static_cast<const data::TextSampleStore&>(*valid).stream();
    return bigram_cross_entropy(t, v, vocab);
  }
  if (!valid_h5_) return std::nullopt;
  if (train_tokens + valid_tokens > kBigramMaxTokens) {
    note = " | bigram baseline skipped (" + std::to_string(train_tokens + valid_tokens) +
           " tokens > " + std::to_string(kBigramMaxTokens) + ")";
    return std::nullopt;
  }
  return bigram_cross_entropy(data::read_token_stream(train_h5_->dataset(), train_tokens),
                              data::read_token_stream(valid_h5_->dataset(), valid_tokens), vocab);
}

}  // namespace dst::train
