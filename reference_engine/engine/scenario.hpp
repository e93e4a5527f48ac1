// Scenario: every run-time choice of an ablation or a single run (model, GPU, workload, engine limits, policy
// parameters, routing model, predictor, cost model), read from a JSON config file (--config) and overridden
// by CLI flags. Defaults = the paper's motivating experiment (DESIGN §4): Qwen1.5-MoE-A2.7B on one RTX 5090,
// ShareGPT-like requests at 10 req/s, 1000 requests, seed 0, every policy.
//
// Config file format (every key optional; unknown keys are errors):
// {
//   "backend": "sim",
//   "model": "qwen1.5-moe-a2.7b", "gpu": "rtx5090", "cost_model": "default", "memory_cap_gib": 0,
//   "usable_fraction": 0.905,
//   "workload": {"rate": 10, "burstiness": 1, "requests": 1000, "seed": 0, "trace": ""},
//   "policies": ["static", "fixed", ...],
//   "engine": {"max_num_batched_tokens": 2048, "max_num_seqs": 256, "max_model_len": 2048},
//   "experts": {"expert_offload_limit": 10, "fixed_offload": 6,
//               "evict_below": 2, "restore_above": 9, "max_restores": 5},
//   "routing": {"source": "synthetic", "ranking": "", "skew": 0.6, "cross_layer_correlation": 0.5,
//   "locality": 0.9, "temporal_sigma": 0.3,
//               "drift": 0, "calibration_tokens": 8192, "temporal_period": 8},
//   "predictor": {"kind": "cross-layer", "accuracy": 0.9}
// }
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/memory_plan.hpp"
#include "engine/routing.hpp"
#include "engine/scheduler.hpp"

namespace amoeba::engine {

struct Scenario {
  std::string backend = "sim";  // a name from the backend table (policy_dispatch.hpp)
  std::string model = "qwen1.5-moe-a2.7b";
  std::string gpu = "rtx5090";
  std::string cost_model = "default";
  MemoryConfig memory{};
  // workload
  double rate = 10.0, burstiness = 1.0;
  std::uint64_t requests = 1000, seed = 0;
  std::string trace;                  // JSONL file; empty = generate ShareGPT-like requests
  std::vector<std::string> policies;  // empty = every policy in the dispatch table
  SchedulerConfig scheduler{};
  // expert residency
  std::uint32_t expert_offload_limit = 10;           // elastic policies: most experts offloaded per layer
  std::optional<std::uint32_t> fixed_offload;        // fixed/LRU/LFU: experts offloaded per layer
  std::uint64_t evict_below = 2, restore_above = 9;  // paper's hysteresis thresholds
  std::uint32_t max_restores = 5;
  RoutingParams routing{};
  // Where routing comes from: "synthetic" (the routing model above, seeded) or a routing record file
  // (engine/routing_record.hpp) replayed step by step.
  std::string routing_source = "synthetic";
  // Expert statistics the policies rank by (amoeba.expert_stats, e.g. from `amoeba rank`); empty = a sample
  // of `calibration_tokens` tokens drawn from the routing model.
  std::string ranking;
  PredictorParams predictor{};

  // Fixed-cache offload per layer: the given value, else 10% of the layer's experts (rounded).
  std::uint32_t fixed_offload_for(std::uint32_t experts) const noexcept;
};

// Applies a JSON config on top of `base`; errors name "config.<field>".
Scenario parse_scenario(std::string_view json_text, const std::string& what, Scenario base = {});
// Checks cross-field rules (policy names, ranges); throws ConfigError.
void validate_scenario(const Scenario& s);
// The scenario as JSON (written into ablate's output).
std::string scenario_to_json(const Scenario& s, int indent = 2);

}  // namespace amoeba::engine
