// TEMPORARY stand-ins for the two functions of model_weights.hpp that the dispatch table calls, compiled only
// while engine/model_weights.cpp does not exist (reference_engine/CMakeLists.txt), so that the engine links
// before that file lands. Delete this file when it does. Not the real definitions: the configuration is
// derived from the catalog's ModelSpec, and the prompt tokens are a fixed hash.
#include <string>

#include "amoeba/core/errors.hpp"
#include "engine/model_weights.hpp"

namespace amoeba::engine {

HfMoeConfig hf_config_for(const ModelSpec& model, const std::string& field) {
  HfMoeConfig c;
  if (model.name == "qwen1.5-moe-a2.7b") {
    c.arch = MoeArchitecture::kQwen2Moe;
    c.architecture = "Qwen2MoeForCausalLM";
    c.qkv_bias = true;
    c.intermediate_size = 5632;
  } else if (model.name == "qwen3-30b-a3b") {
    c.arch = MoeArchitecture::kQwen3Moe;
    c.architecture = "Qwen3MoeForCausalLM";
    c.qk_norm = c.norm_topk_prob = true;
    c.intermediate_size = 6144;
  } else {
    throw ConfigError(field, model.name,
                      "the GPU backend runs no such model (known: qwen1.5-moe-a2.7b, "
                      "qwen3-30b-a3b)");
  }
  c.hidden_size = model.hidden_size;
  c.num_layers = model.num_layers;
  c.num_heads = model.num_heads;
  c.num_kv_heads = model.num_kv_heads;
  c.head_dim = model.head_dim;
  c.vocab_size = model.vocab_size;
  c.num_experts = model.num_experts;
  c.top_k = model.top_k;
  c.moe_intermediate_size = model.moe_intermediate_size;
  c.shared_expert_intermediate_size = model.shared_expert_intermediate_size;
  c.tie_word_embeddings = model.tie_word_embeddings;
  return c;
}

std::int32_t synthetic_prompt_token(std::uint64_t seed, std::uint32_t vocab, std::uint64_t request,
                                    std::uint32_t position) noexcept {
  const std::uint64_t h = (seed * 0x9E3779B97F4A7C15ull) ^ (request * 0xBF58476D1CE4E5B9ull) ^
                          (std::uint64_t(position) * 0x94D049BB133111EBull);
  return static_cast<std::int32_t>(h % (vocab == 0 ? 1 : vocab));
}

}  // namespace amoeba::engine
