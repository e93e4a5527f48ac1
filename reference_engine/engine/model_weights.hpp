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
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "amoeba/core/bf16.hpp"
#include "engine/checkpoint.hpp"
#include "engine/model.hpp"

namespace amoeba::engine {

// The Hugging Face configuration of a catalog model the GPU backend can run with random weights
// (Qwen1.5-MoE-A2.7B, Qwen3-30B-A3B: the values of their config.json). Throws ConfigError(field, model
// name, "... (known: ...)") for any other model.
HfMoeConfig hf_config_for(const ModelSpec& model, const std::string& field = "--model");

struct WeightTensor {
  std::string name;
  std::vector<std::uint64_t> shape;
  std::uint64_t elements() const noexcept;
};

class ModelWeights {
 public:
  virtual ~ModelWeights() = default;
  virtual const HfMoeConfig& config() const noexcept = 0;
  // Every non-routed-expert tensor the forward reads (the shared expert's gate/up/down excepted: they come
  // as chunks), in expected_tensors() order.
  const std::vector<WeightTensor>& tensors() const noexcept { return tensors_; }
  // Reads tensor `name` (one of tensors(), or one of the shared expert's gate/up/down_proj, which
  // read_shared_chunk cuts); dst.size() must be its element count. Thread-safe.
  virtual void read(const std::string& name, std::span<bf16> dst) const = 0;
  // [W1 | W3 | W2] of routed expert `expert` of MoE layer `moe_layer`; dst.size() = 3 x F x H x 2 bytes.
  // Thread-safe.
  virtual void read_expert(std::uint32_t moe_layer, std::uint32_t expert, std::span<std::byte> dst) const = 0;
  // Shared-expert chunks per MoE layer (0 for Qwen3-MoE); Fs must be a multiple of F (ConfigError otherwise,
  // at construction).
  std::uint32_t shared_chunks() const noexcept { return shared_chunks_; }
  // Chunk `chunk` of MoE layer `moe_layer`'s shared expert, in the routed experts' layout. Thread-safe.
  void read_shared_chunk(std::uint32_t moe_layer, std::uint32_t chunk, std::span<std::byte> dst) const;
  // Total bytes of tensors() (what the non-expert weights take on the device).
  std::uint64_t tensor_bytes() const noexcept;

 protected:
  void init(const HfMoeConfig& c);  // fills tensors_ and shared_chunks_; call from the constructor

 private:
  std::vector<WeightTensor> tensors_;
  std::uint32_t shared_chunks_ = 0;
};

// The weights of a checked checkpoint (open_checkpoint).
std::unique_ptr<ModelWeights> checkpoint_weights(const Checkpoint& ck);
// Random weights with `config`'s shapes, deterministic in (seed, tensor name, element): normal-like values
// of std 0.02 (bf16); RMSNorm weights 1; biases std 0.02.
std::unique_ptr<ModelWeights> random_weights(const HfMoeConfig& config, std::uint64_t seed);

// Prompt tokens for generated traces: token `position` of request `request`, uniform over [0, vocab),
// deterministic in (seed, request, position).
std::int32_t synthetic_prompt_token(std::uint64_t seed, std::uint32_t vocab, std::uint64_t request,
                                    std::uint32_t position) noexcept;

}  // namespace amoeba::engine
