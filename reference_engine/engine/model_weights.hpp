// The weights a GPU backend serves, from either source behind one interface: a checked Hugging Face
// checkpoint (engine/checkpoint.hpp) or random weights with a catalog model's real shapes from a seed (no
// checkpoint needed: same bytes on every machine, values of an initialised model, std 0.02). CUDA-free.
//
// Three kinds of bytes, each in the layout the backend keeps on the device:
//   non-expert tensors  by their Hugging Face names and shapes (embedding, attention, norms, router, shared
//                       expert gate, dense MLPs, LM head), bf16, row-major as stored;
//   routed experts      [W1 | W3 | W2] of one expert, W1 = gate_proj [F, H], W3 = up_proj [F, H],
//                       W2 = down_proj [H, F] (the host expert store's layout, Checkpoint::read_expert);
//   shared-expert chunks Qwen2-MoE's one shared expert of intermediate size Fs = c x F cut into c chunks of
//                       the routed experts' size, so the MoE kernel treats them as c more experts: chunk i
//                       is [W1 rows iF..(i+1)F | W3 rows iF..(i+1)F | W2 columns iF..(i+1)F as [H, F]]. The
//                       shared expert's output is the sum of its chunks' (the down projection splits along
//                       its inner dimension).
//
// Random weights (random_weights) are a pure function of (seed, tensor name, element index), so any element
// range of any tensor can be produced on its own, in any order and from any thread:
//   key(name)   = mix64(fnv1a64(name) ^ mix64(seed ^ 0x5eed5eed5eed5eed)), mix64 = splitmix64's finaliser;
//   h(name, i)  = mix64(key(name) + (i + 1) x 0x9e3779b97f4a7c15)   (element i of the row-major tensor);
//   value       = 0.02 x sqrt(3) x (u1 + u2 + u3 + u4 - 2), u_j = (16-bit field j of h + 1/2) / 65536,
//                 as the float product (sum of the fields - 131070) x float(0.02 sqrt(3) / 65536),
//                 rounded to bf16 (nearest even).
// The sum of four uniforms (Irwin-Hall, n = 4) has mean 0, std 0.02 (to the 16-bit fields' resolution) and a
// bell shape (density at the mean 3.5% below the normal's); it is bounded by +-2 sqrt(3) std (+-0.069),
// beyond which a normal has 0.05% of its mass. One 64-bit hash per element, no logarithm or cosine. RMSNorm
// weights (every tensor named "*norm.weight": input_layernorm, post_attention_layernorm, q_norm, k_norm,
// model.norm) are 1; biases and every other tensor, routed experts included, follow the rule above. A routed
// expert's matrices are keyed by their per-expert Hugging Face names (expert_tensor_name), the shared
// expert's by its three tensor names, so a chunk or an expert reads the same bytes however it is cut.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "amoeba/core/bf16.hpp"
#include "engine/checkpoint.hpp"
#include "engine/model.hpp"

namespace amoeba::engine {

// The Hugging Face configuration of a catalog model the GPU backend can run with random weights
// (Qwen1.5-MoE-A2.7B, Qwen3-30B-A3B: the values of their config.json that the engine reads). `model` is
// matched by its hf_id or its catalog name, and must have that config's shapes (the unsharded catalog
// entry). Throws ConfigError(field, model name, "random weights exist for ... (known: ...)") for any other
// model.
HfMoeConfig hf_config_for(const ModelSpec& model, const std::string& field = "--model");

class TpShardedWeights;  // engine/tp_shard.cpp: one rank's slices, read through the whole model's read_block

struct WeightTensor {
  std::string name;
  std::vector<std::uint64_t> shape;
  std::uint64_t elements() const noexcept;                         // the product of shape (1 for a scalar)
  std::uint64_t bytes() const noexcept { return 2 * elements(); }  // bf16
};

class ModelWeights {
 public:
  virtual ~ModelWeights() = default;
  virtual const HfMoeConfig& config() const noexcept = 0;
  // Every non-routed-expert tensor the forward reads (the shared expert's gate/up/down excepted: they come
  // as chunks), in expected_tensors() order.
  const std::vector<WeightTensor>& tensors() const noexcept { return tensors_; }
  // Reads tensor `name` (one of tensors(), or one of the shared expert's gate/up/down_proj, which
  // read_shared_chunk cuts); dst.size() must be its element count (ConfigError otherwise, and for another
  // name). Thread-safe.
  virtual void read(const std::string& name, std::span<bf16> dst) const = 0;
  // [W1 | W3 | W2] of routed expert `expert` of MoE layer `moe_layer`; dst.size() = 3 x F x H x 2 bytes.
  // MoE layers are numbered 0.. in the engine (model layer: model_layer()). Thread-safe.
  virtual void read_expert(std::uint32_t moe_layer, std::uint32_t expert, std::span<std::byte> dst) const = 0;
  // Shared-expert chunks per MoE layer (0 for Qwen3-MoE); Fs must be a multiple of F (ConfigError otherwise,
  // at construction).
  std::uint32_t shared_chunks() const noexcept { return shared_chunks_; }
  // Chunk `chunk` of MoE layer `moe_layer`'s shared expert, in the routed experts' layout; dst.size() = 3 x F
  // x H x 2 bytes. Throws ConfigError for a layer, chunk or size out of range. Thread-safe.
  void read_shared_chunk(std::uint32_t moe_layer, std::uint32_t chunk, std::span<std::byte> dst) const;
  // Total bytes of tensors() (what the non-expert weights take on the device).
  std::uint64_t tensor_bytes() const noexcept;
  // The model layer of MoE layer `moe_layer` (the moe_layer-th layer with is_moe_layer; dense layers come
  // first in every model the engine serves, so this is Checkpoint::model_layer); ~0 when out of range.
  std::uint32_t model_layer(std::uint32_t moe_layer) const noexcept;

 protected:
  // Fills tensors(), shared_chunks() and the readable names from `c`; call from the constructor. Throws
  // ConfigError naming shared_expert_intermediate_size when Fs is not a multiple of F.
  void init(const HfMoeConfig& c);

  // The tensor read() accepts under `name` (tensors() and the shared expert's three matrices); throws
  // ConfigError naming `field` for any other name. Valid after init().
  const WeightTensor& readable(const std::string& name, const char* field) const;
  // Rows [row0, row0 + rows) x columns [col0, col0 + cols) of tensor `name` seen as a row-major matrix of
  // `row_len` columns, written row-major (rows x cols bf16) into dst (dst.size() = rows x cols x 2).
  // read_shared_chunk cuts the shared expert with it. The default reads the whole tensor with read() and
  // copies the block out; a source overrides it to read only the block. Thread-safe.
  struct Block {
    std::uint64_t row_len = 0, row0 = 0, rows = 0, col0 = 0, cols = 0;
  };
  virtual void read_block(const std::string& name, const Block& b, std::span<std::byte> dst) const;

 private:
  friend class TpShardedWeights;  // reads another source's blocks and shapes (readable, read_block)

  std::vector<WeightTensor> tensors_;
  std::map<std::string, WeightTensor> readable_;  // tensors_ and the shared expert's gate/up/down_proj
  std::vector<std::uint32_t> moe_to_model_layer_;
  std::uint64_t expert_matrix_elements_ = 0;  // F x H
  std::uint32_t shared_chunks_ = 0;
};

// The weights of a checked checkpoint (open_checkpoint). Keeps its own copy of `ck` (headers only).
std::unique_ptr<ModelWeights> checkpoint_weights(const Checkpoint& ck);
// Random weights with `config`'s shapes, deterministic in (seed, tensor name, element): normal-like values
// of std 0.02 (bf16); RMSNorm weights 1; biases std 0.02. The exact rule is in the header comment above.
std::unique_ptr<ModelWeights> random_weights(const HfMoeConfig& config, std::uint64_t seed);
// What a served run reads: the checkpoint in `checkpoint_dir` (opened and checked), or, where it is empty,
// random_weights(config, seed).
std::unique_ptr<ModelWeights> serving_weights(const HfMoeConfig& config, const std::string& checkpoint_dir,
                                              std::uint64_t seed);

// Prompt tokens for generated traces: token `position` of request `request`, uniform over [0, vocab),
// deterministic in (seed, request, position). vocab must be > 0 (0 gives 0).
std::int32_t synthetic_prompt_token(std::uint64_t seed, std::uint32_t vocab, std::uint64_t request,
                                    std::uint32_t position) noexcept;

}  // namespace amoeba::engine
