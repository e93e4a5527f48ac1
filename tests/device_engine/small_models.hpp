// The small Qwen2-MoE and Qwen3-MoE configurations the CUDA backend's GPU tests run: real head dim (128) and
// the kernels' tile multiples, few layers, a small vocabulary. Qwen2-MoE: QKV biases, a shared expert of two
// expert-sized chunks behind a sigmoid gate, top-4 of 16 not renormalised. Qwen3-MoE: q/k RMSNorm, 8 query
// heads per KV head, top-4 of 32 renormalised.
#pragma once

#include <cstdint>
#include <string>

#include "engine/checkpoint.hpp"

namespace amoeba::test {

// config.json text of the Qwen2-MoE model with `layers` layers.
inline std::string small_qwen2_json(std::uint32_t layers) {
  return R"({"architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 256, "num_hidden_layers": )" +
         std::to_string(layers) + R"(, "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 512,
  "intermediate_size": 512, "num_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 128,
  "shared_expert_intermediate_size": 256, "norm_topk_prob": false, "rope_theta": 1000000.0,
  "rms_norm_eps": 1e-6})";
}

// config.json text of the Qwen3-MoE model with `layers` layers.
inline std::string small_qwen3_json(std::uint32_t layers) {
  return R"({"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 256, "num_hidden_layers": )" +
         std::to_string(layers) + R"(, "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 128,
  "vocab_size": 512, "intermediate_size": 512, "num_experts": 32, "num_experts_per_tok": 4,
  "moe_intermediate_size": 128, "norm_topk_prob": true, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6})";
}

inline engine::HfMoeConfig small_config(const std::string& json) {
  return engine::parse_hf_moe_config(json, "config.json");
}

}  // namespace amoeba::test
