// The generate driver's CUDA entry point; see generate_driver.hpp.
#include "engine/generate_driver.hpp"

#include <algorithm>
#include <vector>

#include "amoeba/core/errors.hpp"

namespace amoeba::engine {

std::uint64_t generate_pool_bytes(const ModelSpec& model, const PageGeometry& geometry,
                                  std::uint32_t tokens) {
  const std::uint64_t blocks =
      (std::uint64_t(tokens) + PageGeometry::kTokensPerKvPage - 1) / PageGeometry::kTokensPerKvPage;
  const std::uint64_t kv_pages = blocks * model.attention_layers();
  const std::uint64_t per_carrier = geometry.kv_pages_per_expert_page();
  const std::uint64_t carriers = (kv_pages + per_carrier - 1) / per_carrier;
  return (3 * model.total_experts() + carriers) * geometry.expert_page_bytes;
}

CudaBackendConfig generate_backend_config(const HfMoeConfig& config, const ModelSpec& model,
                                          std::uint32_t tokens, std::uint32_t max_batched_tokens,
                                          std::uint32_t max_seqs) {
  CudaBackendConfig c;
  c.model = config;
  c.geometry = page_geometry(model);
  c.pool_bytes = generate_pool_bytes(model, c.geometry, tokens);
  c.load_buffer_experts = 0;  // every expert resident: nothing crosses PCIe during the forward
  c.max_batched_tokens = max_batched_tokens;
  c.max_seqs = max_seqs;
  c.routing = RoutingKind::kModel;
  c.keep_logits = true;
  return c;
}

std::vector<GeneratedToken> generate_on_cuda(const Checkpoint& ck, std::span<const std::int32_t> prompt,
                                             std::uint32_t new_tokens,
                                             std::span<const std::int32_t> teacher) {
  if (prompt.empty()) throw ConfigError("--prompt", "\"\"", "must hold at least one token id");
  const ModelSpec model = ck.config.to_model_spec(ck.dir);
  const auto tokens = static_cast<std::uint32_t>(prompt.size() + generate_steps(new_tokens, teacher));
  CudaBackendConfig c = generate_backend_config(
      ck.config, model, tokens, static_cast<std::uint32_t>(std::max<std::size_t>(prompt.size(), 1)), 1);
  c.checkpoint_dir = ck.dir;
  const std::vector<std::int32_t> ids(prompt.begin(), prompt.end());
  CudaBackend backend(c, [ids](std::uint64_t, std::uint32_t position) { return ids.at(position); });
  return generate_greedy(backend, model, c.geometry, c.pool_bytes, prompt, new_tokens, teacher);
}

}  // namespace amoeba::engine
