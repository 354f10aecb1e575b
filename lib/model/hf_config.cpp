#include "model/hf_config.hpp"

#include <nlohmann/json.hpp>

#include "core/error.hpp"

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
  j["rope_scaling"] = nullptr;  // plain RoPE, as language_model.hpp computes it
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

std::string hf_deepseek_config_json(const config::ModelSection& m, const HfConfigOptions& o) {
  if (!m.mla())
    throw Error("export: a DeepSeekMoE model (model.n_routed_experts " +
                std::to_string(m.n_routed_experts) +
                ") without multi-head latent attention (model.kv_lora_rank 0) has no "
                "transformers architecture");
  const bool v2 = m.n_routed_experts > 0 && m.moe.score == config::MoeScore::softmax;
  const bool moe = m.n_routed_experts > 0;
  nlohmann::ordered_json j;
  j["architectures"] = {v2 ? "DeepseekV2ForCausalLM" : "DeepseekV3ForCausalLM"};
  j["model_type"] = v2 ? "deepseek_v2" : "deepseek_v3";
  j["hidden_size"] = m.d_model;
  j["intermediate_size"] = m.ffn_dim;
  j["num_hidden_layers"] = m.n_layers;
  j["num_attention_heads"] = m.n_heads;
  j["num_key_value_heads"] = m.n_heads;  // MLA: every head has its keys and values
  j["vocab_size"] = m.vocab_size;
  j["max_position_embeddings"] = m.max_seq_len;
  j["rms_norm_eps"] = m.norm_eps;
  j["rope_theta"] = m.rope_theta;
  const config::RopeScalingSection& r = m.rope_scaling;
  if (r.type == config::RopeScalingType::yarn)
    j["rope_scaling"] = {
        {"type", "yarn"},           {"rope_type", "yarn"},
        {"factor", r.factor},       {"original_max_position_embeddings", r.original_max_seq_len},
        {"beta_fast", r.beta_fast}, {"beta_slow", r.beta_slow},
        {"mscale", r.mscale},       {"mscale_all_dim", r.mscale_all_dim}};
  else
    j["rope_scaling"] = nullptr;         // RoPE as trained
  if (!v2) j["rope_interleave"] = true;  // our RoPE pairs (kernels::rope_interleaved_forward)
  j["tie_word_embeddings"] = m.tie_embeddings;
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  if (m.q_lora_rank > 0)
    j["q_lora_rank"] = m.q_lora_rank;
  else
    j["q_lora_rank"] = nullptr;
  j["kv_lora_rank"] = m.kv_lora_rank;
  j["qk_nope_head_dim"] = m.qk_nope_head_dim;
  j["qk_rope_head_dim"] = m.qk_rope_head_dim;
  j["v_head_dim"] = m.v_head_dim;
  j["head_dim"] = m.qk_rope_head_dim;  // transformers' RoPE tables' width
  // A dense model: every block keeps the dense MLP (the MoE fields are then unused, but
  // transformers needs valid ones).
  j["first_k_dense_replace"] = moe ? m.first_k_dense_replace : m.n_layers;
  j["n_routed_experts"] = moe ? m.n_routed_experts : 1;
  j["n_shared_experts"] = moe ? m.n_shared_experts : 0;
  j["num_experts_per_tok"] = moe ? m.num_experts_per_tok : 1;
  j["moe_intermediate_size"] = moe ? m.moe_intermediate_size : 1;
  j["n_group"] = m.n_group;
  j["topk_group"] = m.topk_group;
  j["norm_topk_prob"] = m.norm_topk_prob;
  j["routed_scaling_factor"] = m.routed_scaling_factor;
  // V3's config names its multi-token prediction modules so (the released checkpoints: 1).
  if (!v2) j["num_nextn_predict_layers"] = m.mtp_depth;
  if (v2) {
    j["topk_method"] = m.n_group > 1 ? "group_limited_greedy" : "greedy";
  } else {
    j["topk_method"] = "noaux_tc";
    j["scoring_func"] = "sigmoid";
  }
  j["initializer_range"] = 0.02;  // kInitStd (param_store.hpp)
  j["use_cache"] = true;
  j["torch_dtype"] = o.torch_dtype;
  if (o.bos_token_id) j["bos_token_id"] = *o.bos_token_id;
  if (o.eos_token_id) j["eos_token_id"] = *o.eos_token_id;
  return j.dump(2) + "\n";
}

std::string hf_config_json(const config::ModelSection& m, const HfConfigOptions& o) {
  return m.mla() || m.n_routed_experts > 0 ? hf_deepseek_config_json(m, o)
                                           : hf_llama_config_json(m, o);
}

}  // namespace dst::model
