// A host reference of the Qwen MoE decoders the GPU backend serves (Qwen2-MoE, Qwen3-MoE), read from a
// checked Hugging Face checkpoint (engine/checkpoint.hpp): the oracle that the CUDA backend's forward is
// compared with at small shapes, and that is itself compared with Hugging Face transformers
// (benchmarks/device/hf_oracle.py). No GPU, plain loops: meant for models of a few hundred MB at most.
//
// The forward follows transformers' modules and rounds to bf16 where a bf16 module returns (each Linear's
// output, RMSNorm, RoPE's products and sum, SiLU, every elementwise product, each residual add, each expert's
// contribution as it is accumulated in expert order); inside an operation it accumulates in double. So it
// tracks a bf16 transformers run to within accumulation-order differences, not bit for bit.
//   Qwen2-MoE: QKV biases; softmax router over all experts, top-k NOT renormalised (norm_topk_prob false);
//              one shared expert scaled by sigmoid(shared_expert_gate(x)).
//   Qwen3-MoE: RMSNorm over each head of q and k before RoPE; top-k renormalised (norm_topk_prob true).
// Both: RMSNorm (eps from the config), rotate-half RoPE (rope_theta), causal GQA attention, SiLU-gated
// experts, final RMSNorm, LM head (or tied embeddings), greedy argmax (lowest index wins a tie).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "amoeba/core/bf16.hpp"
#include "engine/checkpoint.hpp"

namespace amoeba::engine {

class DecoderReference {
 public:
  // Reads every tensor of `ck` into host memory (bf16). Throws ConfigError when the weights exceed
  // `max_bytes` (a reference for small models only).
  explicit DecoderReference(const Checkpoint& ck, std::uint64_t max_bytes = 4ull << 30);

  struct Step {
    std::int32_t token = 0;     // argmax of the logits
    std::vector<float> logits;  // over the vocabulary, bf16 values widened
  };
  // Prefills `prompt` (one forward over all its tokens), then `new_tokens` greedy decode steps; returns one
  // Step per generated token (the first comes from the prefill). Starts from an empty KV cache.
  std::vector<Step> generate(std::span<const std::int32_t> prompt, std::uint32_t new_tokens);
  // The same, but after each step the given token is fed instead of the argmax (teacher forcing), so that
  // logits can be compared with another implementation's at every step even after a near-tie. Steps:
  // teacher.size() (the last teacher token is not fed).
  std::vector<Step> generate_forced(std::span<const std::int32_t> prompt,
                                    std::span<const std::int32_t> teacher);

  // Lower level: one forward over `tokens` at the next positions, appended to the KV cache; returns the last
  // token's logits. reset() empties the cache.
  std::vector<float> feed(std::span<const std::int32_t> tokens);
  void reset() noexcept { position_ = 0; }
  std::uint32_t position() const noexcept { return position_; }

  // The experts layer `layer`'s router chose for each token of the last forward ([tokens][top_k]).
  const std::vector<std::vector<std::uint32_t>>& last_routing(std::uint32_t layer) const {
    return routing_[layer];
  }
  const HfMoeConfig& config() const noexcept { return cfg_; }

 private:
  using Vec = std::vector<float>;  // values are bf16-representable unless noted

  // Forward of tokens at positions [pos, pos + n), appending to the KV cache; returns the last token's
  // logits.
  Vec forward(std::span<const std::int32_t> tokens, std::uint32_t pos);
  const std::vector<bf16>& w(const std::string& name) const;
  Vec linear(const Vec& x, std::uint32_t rows, std::uint32_t in, const bf16* weight, std::uint32_t out,
             const bf16* bias = nullptr) const;
  Vec rms_norm(const Vec& x, std::uint32_t rows, std::uint32_t dim, const bf16* weight) const;
  Vec expert_mlp(const Vec& x, std::uint32_t rows, const bf16* w1, const bf16* w3, const bf16* w2,
                 std::uint32_t f) const;
  const bf16* expert(std::uint32_t layer, std::uint32_t e, ExpertMatrix m) const;

  HfMoeConfig cfg_;
  ExpertLayout layout_;
  std::map<std::string, std::vector<bf16>> weights_;
  std::vector<float> inv_freq_;  // RoPE's inverse frequencies, head_dim / 2
  // KV cache per layer: [position][kv head][dim], K after RoPE; bf16 values.
  std::vector<Vec> k_cache_, v_cache_;
  std::vector<std::vector<std::vector<std::uint32_t>>> routing_;
  std::uint32_t position_ = 0;
};

}  // namespace amoeba::engine
