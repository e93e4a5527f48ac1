// Memory accounting on one GPU (DESIGN §3.6, §4): what the unified pool gets and which experts start
// resident. A configuration that cannot fit is refused before start with the numbers (ConfigError). On N
// GPUs (tensor parallelism) the model is one GPU's shard (shard_model) and every number is that GPU's.
//
//   budget       = min(GPU memory, memory cap) x usable_fraction        (vLLM's gpu_memory_utilization)
//   pool         = budget - CUDA context - non-expert weights - activation workspace
//                  - two load buffers of the policy's offload limit each (their transfer bytes: 0 static,
//                    fixed_offload for fixed/lru/lfu, min(expert_offload_limit, E) elastic)
//   activations  = max_num_batched_tokens x 2 B x (8 H + 3 k F + (heads + 2 kv_heads) x head_dim)
//                  + max_num_seqs x vocab x 4 B (fp32 logits; the whole vocabulary, gathered on one GPU)
// The pool must hold the policy's initial resident experts plus the KV (and state) of one request of
// max_model_len tokens, as vLLM requires of its KV cache.
#pragma once

#include <cstdint>
#include <string>

#include "engine/gpu.hpp"
#include "engine/model.hpp"

namespace amoeba::engine {

struct MemoryConfig {
  // Calibrated: with 0.905 the static baseline of the default scenario peaks at ~34 concurrent requests, as
  // in the paper; vLLM's default gpu_memory_utilization (0.90) gives 27 here (docs/reproducing.md).
  double usable_fraction = 0.905;
  std::uint64_t memory_cap_bytes = 0;  // 0 = the GPU's memory
};

struct MemoryPlan {
  std::uint64_t gpu_bytes = 0, budget_bytes = 0;
  std::uint64_t context_bytes = 0, non_expert_bytes = 0, activation_bytes = 0, load_buffer_bytes = 0;
  std::uint64_t pool_bytes = 0;
  std::uint32_t load_buffer_experts = 0;  // per buffer
  std::uint32_t initial_resident_per_layer = 0;
  std::uint64_t initial_expert_bytes = 0;
  std::uint64_t min_kv_bytes = 0;  // one max_model_len request
  std::uint64_t initial_kv_bytes() const noexcept { return pool_bytes - initial_expert_bytes; }
  std::string budget_line() const;  // budget -> pool, in GB
  std::string describe() const;     // budget_line() and the initial split of the pool
};

// `min_resident` .. `max_resident`: the experts per layer the policy may start with (the plan takes the most
// that fit, at least min_resident). Throws ConfigError naming "memory" when even min_resident does not fit.
MemoryPlan plan_memory(const ModelSpec& model, const GpuProfile& gpu, const MemoryConfig& mem,
                       std::uint32_t max_num_batched_tokens, std::uint32_t max_num_seqs,
                       std::uint32_t max_model_len, std::uint32_t load_buffer_experts,
                       std::uint32_t min_resident, std::uint32_t max_resident, const std::string& policy);

}  // namespace amoeba::engine
