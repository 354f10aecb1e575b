#pragma once
/// \file decoder.hpp
/// Inference for the decoder of language_model.hpp, one sequence at a time, with a key/value
/// cache: the prompt is run once (prefill), then each new token costs one row of every
/// layer instead of the whole sequence again. DeepSeek-V2/V3 models cache the compressed
/// latent of latent attention (LatentKVCache, absorbed products) and route each decoded
/// token through their DeepSeekMoE blocks as training does.
///
/// It runs the training model's layers (model/transformer.hpp: the same embedding, block
/// and head code, the same kernels, matrix products and RoPE tables), so the logits at
/// every position equal LanguageModel::forward's on the same tokens up to the order of the
/// attention sums (tests/unit/model/decoder_test.cpp): the attention takes its cached path
/// (Attention::forward with a KVCache), whose softmax over the cached keys is a small host
/// loop that applies the causal mask of rows starting at the cache's current position
/// (kernels::causal_softmax_forward handles square blocks from position 0 only). The
/// decoder therefore runs on the host (the Kokkos context).
///
/// Sampling (greedy, temperature, top-k, top-p) draws from the counter-based generator
/// of core/rng.hpp keyed by (seed, token index): a generation is a pure function of the
/// checkpoint, the prompt and the options.

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "config/run_config.hpp"
#include "model/param_store.hpp"
#include "tensor/arena.hpp"
#include "tensor/context.hpp"
#include "tensor/tensor.hpp"

namespace dst::model {

class Decoder {
 public:
  /// A decoder of sequences up to `max_len` tokens (<= m.max_seq_len) over `params`,
  /// which must have dense_parameter_layout(m) and outlive the decoder (it is read, never
  /// written). Allocates the cache (L x max_len x cache_values_per_token(m) floats) and
  /// the scratch for a prefill of max_len tokens once.
  Decoder(const config::ModelSection& m, const ParamStore& params, std::int64_t max_len,
          tensor::ExecContext ctx = {});
  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  /// The floats one layer's cache holds per token: 2 x n_kv_heads x head_dim (keys and
  /// values), or with latent attention kv_lora_rank + qk_rope_head_dim (the normalised
  /// latent and the RoPE key: 512 + 64 = 576 for DeepSeek-V3).
  static std::int64_t cache_values_per_token(const config::ModelSection& m);
  /// The floats this decoder's cache holds per token and layer (its buffers' sizes).
  std::int64_t cache_values() const;

  /// Empties the cache: the next append() starts at position 0.
  void reset();
  /// Tokens in the cache (the position of the next token).
  std::int64_t position() const;
  std::int64_t max_len() const;
  std::int64_t vocab_size() const;

  /// Runs `n` tokens at positions position() .. position() + n - 1 (n >= 1; a prompt at
  /// once, or one token), adds their keys and values to the cache, and returns the
  /// logits: (n, V) with `all_logits`, else (1, V) of the last token. The tensor is valid
  /// until the next call. Throws dst::Error past max_len or for a token outside [0, V).
  tensor::Tensor append(const std::int32_t* tokens, std::int64_t n, bool all_logits = false);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// How the next token is chosen from the logits.
struct SamplingOptions {
  double temperature = 0.0;  ///< 0: greedy (argmax); > 0: sample softmax(logits / T)
  std::int64_t top_k = 0;    ///< keep the k most likely tokens (0: all)
  double top_p = 1.0;        ///< keep the smallest most-likely set of mass >= top_p (1: all)
  std::uint64_t seed = 0;    ///< the generator's key (core/rng.hpp)
};

/// Throws dst::Error naming the option for temperature < 0 or not finite, top_k < 0, or
/// top_p outside (0, 1].
void validate(const SamplingOptions& o);

/// The distribution sampling draws from: (token, probability) pairs, most likely first
/// (ties: lower id first), probabilities renormalised over the kept tokens. Temperature
/// 0 gives the argmax alone with probability 1. Probabilities are computed in double from
/// logits / temperature with the maximum subtracted.
std::vector<std::pair<std::int32_t, double>> sampling_distribution(const float* logits,
                                                                   std::int64_t vocab,
                                                                   const SamplingOptions& o);

/// The next token: the argmax (lowest id on ties) for temperature 0, else a draw from
/// sampling_distribution with u = core::uniform01(seed, stream "generate.sample",
/// `index`); pass the index of the token being generated (0, 1, ...).
std::int32_t sample_token(const float* logits, std::int64_t vocab, const SamplingOptions& o,
                          std::uint64_t index);

}  // namespace dst::model
