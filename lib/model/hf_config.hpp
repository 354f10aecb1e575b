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

/// config.json of a DeepSeek-V2/V3 model (multi-head latent attention, with or without
/// DeepSeekMoE): DeepseekV3ForCausalLM (model_type deepseek_v3; rope_interleave true, the
/// pairs our RoPE rotates), or DeepseekV2ForCausalLM for softmax routing
/// (model.moe.score softmax), with the MLA and MoE fields under transformers' names. A
/// dense MLA model is a V3 model whose first_k_dense_replace is every layer. rope_scaling
/// null. Throws dst::Error for a model without latent attention (MoE with standard
/// attention has no transformers architecture).
std::string hf_deepseek_config_json(const config::ModelSection& m, const HfConfigOptions& o = {});

/// hf_deepseek_config_json for latent-attention models, hf_llama_config_json otherwise.
std::string hf_config_json(const config::ModelSection& m, const HfConfigOptions& o = {});

}  // namespace dst::model
