// Memory accounting; see memory_plan.hpp.
#include "engine/memory_plan.hpp"

#include <algorithm>
#include <cstdio>

#include "amoeba/core/errors.hpp"

namespace amoeba::engine {

namespace {
std::string gb(std::uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GB", double(b) / 1e9);
  return buf;
}
}  // namespace

std::string MemoryPlan::budget_line() const {
  return "budget " + gb(budget_bytes) + " of " + gb(gpu_bytes) + " - context " + gb(context_bytes) +
         " - non-expert weights " + gb(non_expert_bytes) + " - activations " + gb(activation_bytes) +
         " - load buffers " + gb(load_buffer_bytes) + " (2 x " + std::to_string(load_buffer_experts) +
         " experts) = pool " + gb(pool_bytes);
}

std::string MemoryPlan::describe() const {
  return budget_line() + "; experts resident " + gb(initial_expert_bytes) + " (" +
         std::to_string(initial_resident_per_layer) + " per layer), KV " + gb(initial_kv_bytes());
}

MemoryPlan plan_memory(const ModelSpec& model, const GpuProfile& gpu, const MemoryConfig& mem,
                       std::uint32_t max_num_batched_tokens, std::uint32_t max_num_seqs,
                       std::uint32_t max_model_len, std::uint32_t load_buffer_experts,
                       std::uint32_t min_resident, std::uint32_t max_resident, const std::string& policy) {
  MemoryPlan p;
  p.gpu_bytes =
      mem.memory_cap_bytes > 0 ? std::min(gpu.memory_bytes, mem.memory_cap_bytes) : gpu.memory_bytes;
  p.budget_bytes = static_cast<std::uint64_t>(double(p.gpu_bytes) * mem.usable_fraction);
  p.context_bytes = gpu.cuda_context_bytes;
  p.non_expert_bytes = 2 * model.non_expert_params();
  const std::uint64_t per_token =
      2ull * (8ull * model.hidden_size + 3ull * model.top_k * model.moe_intermediate_size +
              (std::uint64_t(model.num_heads) + 2ull * model.num_kv_heads) * model.head_dim);
  p.activation_bytes = std::uint64_t(max_num_batched_tokens) * per_token +
                       std::uint64_t(max_num_seqs) * model.logits_vocab() * 4;
  p.load_buffer_experts = load_buffer_experts;
  p.load_buffer_bytes = 2ull * load_buffer_experts * model.expert_transfer_bytes();
  const std::uint64_t fixed = p.context_bytes + p.non_expert_bytes + p.activation_bytes + p.load_buffer_bytes;
  const std::string who =
      model.name + " on " + gpu.name + " (policy " + policy + ")" + (gpu.gpus > 1 ? ", per GPU" : "");
  if (fixed >= p.budget_bytes)
    throw ConfigError("memory", who,
                      "does not fit: context, non-expert weights, activations and load buffers need " +
                          gb(fixed) + " > budget " + gb(p.budget_bytes) + " (" + gb(p.gpu_bytes) +
                          " x usable_fraction " + std::to_string(mem.usable_fraction) + ")");
  p.pool_bytes = p.budget_bytes - fixed;
  const PageGeometry g = page_geometry(model);
  const std::uint64_t blocks =
      (max_model_len + PageGeometry::kTokensPerKvPage - 1) / PageGeometry::kTokensPerKvPage;
  // One request of max_model_len, plus one expert page of slack for KV pages split off a partly used carrier.
  p.min_kv_bytes = blocks * model.attention_layers() * g.kv_page_bytes +
                   model.linear_layers() * (g.ssm_page_bytes + g.conv_page_bytes) + g.expert_page_bytes;
  const std::uint64_t per_layer_row = std::uint64_t(model.moe_layers()) * model.expert_bytes();
  std::uint32_t r = std::min(max_resident, model.num_experts);
  while (r > min_resident && std::uint64_t(r) * per_layer_row + p.min_kv_bytes > p.pool_bytes) --r;
  if (std::uint64_t(r) * per_layer_row + p.min_kv_bytes > p.pool_bytes)
    throw ConfigError(
        "memory", who,
        "does not fit: " + std::to_string(r) + " resident experts per layer need " +
            gb(std::uint64_t(r) * per_layer_row) + " + KV for one " + std::to_string(max_model_len) +
            "-token request " + gb(p.min_kv_bytes) + " > pool " + gb(p.pool_bytes) + " (" + p.budget_line() +
            (min_resident >= model.num_experts
                 ? "); this policy keeps every expert resident: leave it out (--policies) or use a "
                   "larger GPU"
                 : "); offload more (--expert-offload-limit for elastic policies, --fixed-offload "
                   "for fixed/lru/lfu), lower max_model_len, or use a larger GPU"));
  p.initial_resident_per_layer = r;
  p.initial_expert_bytes = std::uint64_t(r) * per_layer_row;
  return p;
}

}  // namespace amoeba::engine
