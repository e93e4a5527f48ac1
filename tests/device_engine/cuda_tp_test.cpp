// Tensor parallelism on the CUDA backend: a TpGroup of CudaBackend ranks, each serving its shard of the same
// random weights (sharded_weights, shard_config's shapes, its own pool), against the one-GPU backend on the
// whole model. On one GPU the ranks share the device and sum through the host-staged collective
// (host_sum_group: NCCL refuses two ranks on one device); with two or more GPUs the NCCL test runs too.
//
// What is compared: the tp 2 group teacher-forced with the tp 1 run's greedy tokens, step by step: logits to
// the bf16 tolerance of the reference test (a rank's partial sums are rounded to bf16 before the sum, the
// whole model's once: sums in another order, not bit-identical), and the argmax wherever tp 1's top-1 margin
// is clear of that tolerance. The group also checks every step that its ranks routed alike (TpGroup). The
// models: Qwen2-MoE (QKV biases, a shared expert of two expert-sized chunks; tp 2 gives each rank one head
// and half of every expert and chunk) and Qwen3-MoE (q/k norms, 4 query heads per rank reading the one KV
// head, replicated on both ranks). Exits 77 (skipped) without a GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "engine/cuda_backend.hpp"
#include "engine/generate_driver.hpp"
#include "engine/model_weights.hpp"
#include "engine/tp_collective.hpp"
#include "engine/tp_group.hpp"
#include "engine/tp_shard.hpp"
#include "logits_match.hpp"

using namespace amoeba;
using namespace amoeba::engine;

namespace {

// Shapes that split over 2 ranks with the kernels' multiples on each (F / 2 = 128).
std::string qwen2_tp_json() {
  return R"({"architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 256, "num_hidden_layers": 2,
  "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 512, "intermediate_size": 512,
  "num_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 256,
  "shared_expert_intermediate_size": 512, "norm_topk_prob": false, "rope_theta": 1000000.0,
  "rms_norm_eps": 1e-6})";
}
std::string qwen3_tp_json() {
  return R"({"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 256, "num_hidden_layers": 2,
  "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 128, "vocab_size": 512,
  "intermediate_size": 512, "num_experts": 32, "num_experts_per_tok": 4, "moe_intermediate_size": 256,
  "norm_topk_prob": true, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6})";
}

// What generate_greedy needs of a backend, over a TpGroup of CudaBackend ranks: tokens and logits are rank
// 0's (every rank samples the same: the group checks their routing, the collective hands every rank the
// same bits); a teacher's token goes to every rank.
struct TpCuda {
  TpGroup<CudaBackend> group;
  static constexpr bool kMeasured = true;
  std::string_view name() const { return group.name(); }
  double idle_step_s() const { return group.idle_step_s(); }
  template <class Pool>
  std::optional<ChangeError> forward(const StepInput<Pool>& in, StepResult& out) {
    return group.forward(in, out);
  }
  void populate(const ResidencyTable& r) { group.populate(r); }
  std::span<const std::int32_t> tokens(std::uint64_t request) const { return group.rank(0).tokens(request); }
  void replace_last_token(std::uint64_t request, std::int32_t token) {
    for (std::uint32_t r = 0; r < group.tp(); ++r) group.rank(r).replace_last_token(request, token);
  }
  const std::vector<std::vector<float>>& last_logits() const { return group.rank(0).last_logits(); }
};

// Rank s.rank's shapes (the whole model's at tp 1) and its generate config over the shared weights `w`.
CudaBackendConfig base_config(const HfMoeConfig& c, std::shared_ptr<const ModelWeights> w, TpShard s,
                              std::uint32_t tokens, ModelSpec& model) {
  model = s.tp == 1 ? c.to_model_spec("tp1") : tp_rank_model(c, s, "tp-rank");
  CudaBackendConfig cfg = generate_backend_config(c, model, tokens, 64, 4);
  cfg.full_weights = std::move(w);
  cfg.shard = s;
  return cfg;
}

void tp_matches_one_gpu(const std::string& name, const std::string& json,
                        std::vector<std::shared_ptr<TpCollective>> collectives,
                        const std::vector<int>& devices) {
  const HfMoeConfig c = parse_hf_moe_config(json, "config.json");
  const std::shared_ptr<const ModelWeights> w = random_weights(c, 7);
  std::vector<std::int32_t> prompt;
  for (int i = 0; i < 37; ++i) prompt.push_back((i * 97 + 11) % int(c.vocab_size));
  const auto prompts = [&](std::uint64_t, std::uint32_t p) { return prompt.at(p); };
  constexpr std::uint32_t kSteps = 12;
  const std::uint32_t tokens = std::uint32_t(prompt.size()) + kSteps;

  ModelSpec m1;
  const CudaBackendConfig c1 = base_config(c, w, TpShard{}, tokens, m1);
  CudaBackend one(c1, prompts);
  const auto ref = generate_greedy(one, m1, c1.geometry, c1.pool_bytes, prompt, kSteps);
  std::vector<std::int32_t> teacher;
  for (const auto& t : ref) teacher.push_back(t.token);

  const auto tp = static_cast<std::uint32_t>(collectives.size());
  ModelSpec m2;
  CudaBackendConfig c2;  // every rank's shapes, geometry and pool are equal: the last one's serve the group
  std::vector<std::unique_ptr<CudaBackend>> ranks;
  for (std::uint32_t r = 0; r < tp; ++r) {
    c2 = base_config(c, w, TpShard{tp, r}, tokens, m2);
    c2.collective = collectives[r];
    c2.device = devices[r];
    ranks.push_back(std::make_unique<CudaBackend>(c2, prompts));
  }
  CHECK(c2.geometry.expert_page_bytes * tp == c1.geometry.expert_page_bytes);  // each rank: 1/tp of experts
  TpCuda group{TpGroup<CudaBackend>(std::move(ranks))};
  const auto got = generate_greedy(group, m2, c2.geometry, c2.pool_bytes, prompt, 0, teacher);
  const double worst = test::check_logits_match(name + " tp " + std::to_string(tp), ref, got);
  WARN(name << " at tp " << tp << " (" << collectives.front()->name()
            << "): worst max |dlogit| / max |logit| "
            << "against tp 1 over " << got.size() << " steps: " << worst);
}

}  // namespace

TEST_CASE("cuda backend at tp 2 on one GPU (host-staged sums): the logits of tp 1", "[tp]") {
  tp_matches_one_gpu("qwen2", qwen2_tp_json(), host_sum_group(2), {0, 0});
  tp_matches_one_gpu("qwen3", qwen3_tp_json(), host_sum_group(2), {0, 0});
}

TEST_CASE("cuda backend at tp 2 over NCCL on two GPUs: the logits of tp 1", "[tp][nccl]") {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 2) {
    WARN("fewer than 2 GPUs: the NCCL case needs nvidia-h200-x2");
    return;
  }
  tp_matches_one_gpu("qwen2", qwen2_tp_json(), nccl_group({0, 1}), {0, 1});
  tp_matches_one_gpu("qwen3", qwen3_tp_json(), nccl_group({0, 1}), {0, 1});
}
