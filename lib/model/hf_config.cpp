#include "model/hf_config.hpp"

#include <nlohmann/json.hpp>

namespace dst::model {

std::string hf_llama_config_json(const config::ModelSection& m, const HfConfigOptions& o) {
  nlohmann::ordered_json j;
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
  j["hidden_size"] = m.d_model;
  j["intermediate_size"] = m.ffn_dim;
  j["num_hidden_layers"] = m.n_layers;
  j["num_attention_heads"] = m.n_heads;
  j["num_key_value_heads"] = m.n_kv_heads;
  j["head_dim"] = m.d_model / m.n_heads;
  j["vocab_size"] = m.vocab_size;
  j["max_position_embeddings"] = m.max_seq_len;
  j["rms_norm_eps"] = m.norm_eps;
  j["rope_theta"] = m.rope_theta;
  j["rope_scaling"] = nullptr;  // plain RoPE, as dense_model.hpp computes it
  j["tie_word_embeddings"] = m.tie_embeddings;
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["mlp_bias"] = false;
  j["initializer_range"] = 0.02;  // kInitStd (param_store.hpp)
  j["pretraining_tp"] = 1;
  j["use_cache"] = true;
  j["torch_dtype"] = o.torch_dtype;
  if (o.bos_token_id) j["bos_token_id"] = *o.bos_token_id;
  if (o.eos_token_id) j["eos_token_id"] = *o.eos_token_id;
  return j.dump(2) + "\n";
}

}  // namespace dst::model
