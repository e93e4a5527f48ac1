// Model specifications (public config facts) and the quantities the engine derives from them: page sizes of
// the unified pool, weight bytes split into routed experts and the rest, KV bytes per token, SSM/conv state.
//
// The catalog is a set of JSON files under reference_engine/data/models/, compiled into the binary so the
// `amoeba` CLI works from any directory. A path ending in ".json" may be given instead of a catalog name.
//
// Page sizes (bf16 cache, DESIGN §3.1):
//   expert page = moe_intermediate_size x hidden_size x 2 B (one of W1 gate, W3 up, W2 down of one expert) in
//                 bf16; quantized experts (int8, int4) are F x H x bits / 8 B of weights plus bf16 scales,
//                 one per 128 values along K (group-wise, as GPTQ/AWQ-style kernels read them), and their
//                 page may be rounded up so that KV pages nest (expert_page_bytes());
//   KV page     = 16 tokens x (K and V) x kv_heads x head_dim x 2 B for one layer (GQA), or
//                 16 tokens x (kv_lora_rank + qk_rope_head_dim) x 2 B for MLA, rounded up to the smallest
//                 divisor of the expert page (amoeba::smallest_divisor_at_least); the padding is reported;
//   SSM page    = one linear-attention layer's recurrent state of one request (value_heads x dk x dv);
//   conv page   = one layer's causal-convolution state of one request, rounded up like MLA pages.
//
// Tensor parallelism (shard_model): N GPUs each hold 1/N of every expert (F / N of W1, W3 and W2), 1/N of the
// attention heads (KV heads too; when N > kv_heads each GPU keeps one KV head, replicated as vLLM does; an
// MLA latent is replicated), 1/N of the linear-attention heads and of the vocabulary (embedding and LM head).
// The engine plans and prices one GPU's shard: every GPU runs the same batch and holds the same experts, so
// one shard's pool stands for all of them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace amoeba::engine {

enum class AttentionKind : std::uint8_t { kGqa, kMla };

// How routed experts are stored on the host, copied over PCIe and kept in pages. Shared experts, attention
// and every other weight stay bf16.
enum class ExpertPrecision : std::uint8_t { kBf16, kInt8, kInt4 };
std::string_view to_string(ExpertPrecision p) noexcept;
// "bf16", "int8" or "int4"; anything else throws ConfigError(field, value, rule).
ExpertPrecision expert_precision_from_string(const std::string& s, const std::string& field);

struct LinearAttentionSpec {
  std::uint32_t full_attention_interval = 0;  // layer i has full attention iff (i + 1) % interval == 0
  std::uint32_t num_key_heads = 0, num_value_heads = 0, key_head_dim = 0, value_head_dim = 0;
  std::uint32_t conv_kernel_size = 0;
  std::uint32_t state_bytes_per_value = 2;
};

struct ModelSpec {
  std::string name, hf_id, source;
  std::uint32_t num_layers = 0, hidden_size = 0, vocab_size = 0;
  bool tie_word_embeddings = false;
  // attention
  AttentionKind attention = AttentionKind::kGqa;
  std::uint32_t num_heads = 0, num_kv_heads = 0, head_dim = 0;
  bool qkv_bias = false, output_gate = false;
  std::uint32_t kv_lora_rank = 0, qk_rope_head_dim = 0, qk_nope_head_dim = 0, v_head_dim = 0;  // MLA
  // mixture of experts
  std::uint32_t num_experts = 0, top_k = 0, moe_intermediate_size = 0;
  std::uint32_t num_shared_experts = 0, shared_expert_intermediate_size = 0;
  std::uint32_t first_dense_layers = 0, dense_intermediate_size = 0;
  std::optional<LinearAttentionSpec> linear;
  // Deployment, set by shard_model() (a catalog entry has 1 and bf16): the sizes below are one GPU's share.
  std::uint32_t tensor_parallel = 1;
  std::uint32_t full_vocab_size = 0;  // vocab_size before sharding (0: not sharded)
  std::uint32_t logits_vocab() const noexcept { return full_vocab_size ? full_vocab_size : vocab_size; }
  ExpertPrecision expert_precision = ExpertPrecision::kBf16;
  static constexpr std::uint32_t kQuantGroup = 128;  // values along K per bf16 scale (int8, int4)

  std::uint32_t moe_layers() const noexcept { return num_layers - first_dense_layers; }
  bool is_hybrid() const noexcept { return linear.has_value(); }
  bool has_full_attention(std::uint32_t layer) const noexcept {
    return !linear || (layer + 1) % linear->full_attention_interval == 0;
  }
  std::uint32_t attention_layers() const noexcept;  // layers with a KV cache
  std::uint32_t linear_layers() const noexcept { return num_layers - attention_layers(); }

  // One weight matrix of one expert as stored on the host and copied over PCIe: weights, plus scales when
  // quantized (the larger of W1/W3 (F x H, K = H) and W2 (H x F, K = F), so one page size fits all three).
  std::uint64_t expert_page_payload_bytes() const noexcept;
  std::uint64_t expert_scale_bytes() const noexcept;  // the scales in that payload (0 for bf16)
  // The pool's expert page: the payload; for a quantized precision rounded up to a multiple of the KV page
  // when that wastes a smaller fraction than rounding the KV page up to a divisor of the payload.
  std::uint64_t expert_page_bytes() const noexcept;
  std::uint64_t expert_bytes() const noexcept { return 3 * expert_page_bytes(); }  // pool bytes, one expert
  // Bytes one expert moves over PCIe (and the MoE kernel reads): its three matrices' payloads.
  std::uint64_t expert_transfer_bytes() const noexcept { return 3 * expert_page_payload_bytes(); }
  std::uint64_t total_experts() const noexcept { return std::uint64_t(moe_layers()) * num_experts; }
  // K and V (or the MLA latent) of one token in one layer.
  std::uint64_t kv_bytes_per_token_layer() const noexcept;
  std::uint64_t kv_bytes_per_token() const noexcept {
    return kv_bytes_per_token_layer() * attention_layers();
  }
  std::uint64_t ssm_state_bytes() const noexcept;   // per linear layer per request (0 if none)
  std::uint64_t conv_state_bytes() const noexcept;  // per linear layer per request (0 if none)

  // Parameter counts (weights are bf16: bytes = 2 x params).
  std::uint64_t routed_expert_params() const noexcept;
  std::uint64_t attention_params(std::uint32_t layer) const noexcept;  // full or linear attention mixer
  std::uint64_t shared_and_router_params() const noexcept;             // per MoE layer
  std::uint64_t non_expert_params() const noexcept;
  std::uint64_t total_params() const noexcept { return routed_expert_params() + non_expert_params(); }
};

// Page sizes the pool is built with.
struct PageGeometry {
  static constexpr std::uint32_t kTokensPerKvPage = 16;              // vLLM's default block size
  static constexpr std::uint64_t kMaxLargePageBytes = 256ull << 20;  // lcm(expert, SSM page) at most this
  std::uint64_t expert_page_bytes = 0;
  std::uint64_t expert_payload_bytes = 0;  // <= expert_page_bytes (quantized pages may be padded)
  std::uint64_t kv_page_bytes = 0, kv_payload_bytes = 0;  // payload <= bytes; the rest is padding
  std::uint64_t ssm_page_bytes = 0;                       // 0 when the model has no linear attention
  std::uint64_t conv_page_bytes = 0, conv_payload_bytes = 0;
  std::uint64_t kv_pages_per_expert_page() const noexcept { return expert_page_bytes / kv_page_bytes; }
  std::uint64_t kv_padding_bytes() const noexcept { return kv_page_bytes - kv_payload_bytes; }
  std::uint64_t expert_padding_bytes() const noexcept { return expert_page_bytes - expert_payload_bytes; }
  std::uint64_t conv_padding_bytes() const noexcept { return conv_page_bytes - conv_payload_bytes; }
};
// Throws ConfigError if a page size cannot be made to nest.
PageGeometry page_geometry(const ModelSpec& m);

// One GPU's shard of `m` under tensor parallelism over `tp` GPUs, with routed experts in `precision`
// (see the header comment); with tp = 1 and bf16 it returns m unchanged. Throws ConfigError naming `field`
// (the flag or key that set tp) when a dimension does not split: heads, linear-attention heads, expert,
// shared-expert and dense intermediate sizes must be multiples of tp; KV heads a multiple or a divisor of tp.
ModelSpec shard_model(const ModelSpec& m, std::uint32_t tp, ExpertPrecision precision,
                      const std::string& field);

// Parses one model file's JSON text; `what` names it in errors. Validates every field.
ModelSpec parse_model(std::string_view json_text, const std::string& what);
// The built-in catalog, in a fixed order.
const std::vector<ModelSpec>& model_catalog();
// A catalog name, or a path to a model JSON file. Unknown names throw ConfigError listing the known ones.
ModelSpec find_model(const std::string& name_or_path);

}  // namespace amoeba::engine
