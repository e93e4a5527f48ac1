// Hugging Face checkpoints of the MoE architectures the GPU backend serves (Qwen2-MoE, e.g.
// Qwen1.5-MoE-A2.7B; Qwen3-MoE, e.g. Qwen3-30B-A3B), checked on the host before any GPU memory is taken:
//   DIR/config.json                        architecture and shapes (parse_hf_moe_config);
//   DIR/model.safetensors.index.json       optional: which shard holds which tensor ("weight_map");
//   DIR/*.safetensors                      the shards (engine/safetensors.hpp).
// open_checkpoint() derives every tensor the architecture needs (expected_tensors) and checks that each is
// present exactly once, in bf16, with its shape. Routed experts come in either of two layouts, per layer:
//   per expert (the hub's checkpoints): mlp.experts.E.{gate,up,down}_proj.weight, [F, H], [F, H], [H, F];
//   fused (transformers 5's in-memory names): mlp.experts.gate_up_proj [E, 2F, H] (gate rows, then up rows)
//   and mlp.experts.down_proj [E, H, F].
// The first problem found the first problem is a ConfigError that names the tensor,
// the expected and the found value ("checkpoint DIR: tensor model.layers.0.mlp.experts.3.down_proj.weight:
// shape = [64, 30]: expected [64, 32]"). Tensors no architecture needs are listed, not refused.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "amoeba/engine/expert_location.hpp"
#include "engine/model.hpp"
#include "engine/safetensors.hpp"

namespace amoeba::engine {

enum class MoeArchitecture : std::uint8_t { kQwen2Moe, kQwen3Moe };

struct HfMoeConfig {
  MoeArchitecture arch = MoeArchitecture::kQwen2Moe;
  std::string architecture;  // "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"
  std::uint32_t hidden_size = 0, num_layers = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0;
  std::uint32_t vocab_size = 0, intermediate_size = 0;  // intermediate_size: dense MLP layers
  std::uint32_t num_experts = 0, top_k = 0, moe_intermediate_size = 0;
  std::uint32_t shared_expert_intermediate_size = 0;  // Qwen2-MoE: one shared expert behind a sigmoid gate
  std::uint32_t decoder_sparse_step = 1;
  std::vector<std::uint32_t> mlp_only_layers;
  bool norm_topk_prob = false, tie_word_embeddings = false;
  bool qkv_bias = false;  // Qwen2-MoE: q/k/v projections have biases
  bool qk_norm = false;   // Qwen3-MoE: RMSNorm over each head of q and k
  double rms_norm_eps = 1e-6, rope_theta = 10000.0;

  bool is_moe_layer(std::uint32_t layer) const noexcept;
  std::uint32_t moe_layers() const noexcept;
  // The catalog's view of this model (ModelSpec), so the memory plan and the simulator see the same shapes.
  ModelSpec to_model_spec(const std::string& name) const;
};

// Parses config.json text; throws ConfigError naming "<what>.<field>" for a missing or bad field and for an
// architecture other than the two above.
HfMoeConfig parse_hf_moe_config(std::string_view text, const std::string& what);

struct ExpectedTensor {
  std::string name;
  std::vector<std::uint64_t> shape;
};
enum class ExpertLayout : std::uint8_t { kPerExpert, kFused };

// Every tensor the architecture reads, in a fixed order (embedding, layers, final norm, LM head), with the
// routed experts of every MoE layer in `layout`.
std::vector<ExpectedTensor> expected_tensors(const HfMoeConfig& c,
                                             ExpertLayout layout = ExpertLayout::kPerExpert);
// The name of one routed expert's matrix (gate_proj = W1, up_proj = W3, down_proj = W2).
std::string expert_tensor_name(std::uint32_t layer, std::uint32_t expert, ExpertMatrix m);

// Where one routed expert matrix's bytes are: a tensor and a byte range inside it (the whole tensor in the
// per-expert layout; a slice of the fused one).
struct ExpertSlice {
  std::string tensor;
  std::uint64_t offset = 0, bytes = 0;
};

struct Checkpoint {
  std::string dir;
  HfMoeConfig config;
  ExpertLayout layout = ExpertLayout::kPerExpert;
  std::vector<SafetensorsFile> shards;
  std::map<std::string, std::size_t> shard_of;  // tensor name -> index into shards
  std::vector<std::string> unused;              // tensors in the files that no layer reads
  const TensorInfo& tensor(const std::string& name) const;
  const SafetensorsFile& shard(const std::string& name) const { return shards[shard_of.at(name)]; }
  ExpertSlice expert_slice(std::uint32_t layer, std::uint32_t expert, ExpertMatrix m) const;
  // Model layer of MoE layer `moe_layer` (MoE layers are numbered 0.. in the engine; dense layers come
  // first).
  std::uint32_t model_layer(std::uint32_t moe_layer) const noexcept;
  // Writes one routed expert as the host expert store holds it: W1, W3, W2 back to back (3 x F x H bf16),
  // expert `expert` of MoE layer `moe_layer`. dst.size() must be 3 x matrix bytes. Thread-safe.
  void read_expert(std::uint32_t moe_layer, std::uint32_t expert, std::span<std::byte> dst) const;
};

// Opens and checks a checkpoint directory (nothing is read beyond the headers). Throws ConfigError.
Checkpoint open_checkpoint(const std::string& dir);

}  // namespace amoeba::engine
