#pragma once
/// \file hf_config.hpp
/// The Hugging Face `config.json` of a dense model: LlamaForCausalLM, the architecture
/// our parameter names and shapes follow (param_store.hpp), so `transformers` loads an
/// exported checkpoint with AutoModelForCausalLM.from_pretrained(dir).

#include <cstdint>
#include <optional>
#include <string>

#include "config/run_config.hpp"

namespace dst::model {

struct HfConfigOptions {
  std::string torch_dtype = "float32";  ///< the dtype the weights are stored in
  std::optional<std::int64_t> bos_token_id;
  std::optional<std::int64_t> eos_token_id;
};

/// config.json text (pretty-printed JSON, ending with a newline) for the model section:
/// architectures [LlamaForCausalLM], model_type llama, hidden_size, intermediate_size,
/// num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, vocab_size,
/// max_position_embeddings, rms_norm_eps, rope_theta, tie_word_embeddings, hidden_act
/// silu, attention_bias and mlp_bias false, torch_dtype, and the BOS/EOS ids when known.
std::string hf_llama_config_json(const config::ModelSection& m, const HfConfigOptions& o = {});

}  // namespace dst::model
