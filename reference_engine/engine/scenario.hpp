// Scenario: every run-time choice of an ablation or a single run (model, GPU, workload, engine limits, policy
// parameters, routing model, predictor, cost model), read from a JSON config file (--config) and overridden
// by CLI flags. Defaults = the paper's motivating experiment (DESIGN §4): Qwen1.5-MoE-A2.7B on one RTX 5090,
// ShareGPT-like requests at 10 req/s, 1000 requests, seed 0, every policy.
//
// Config file format (every key optional; unknown keys are errors):
// {
//   "backend": "sim",
//   "model": "qwen1.5-moe-a2.7b", "weights": "", "gpu": "rtx5090", "cost_model": "default",
//   "memory_cap_gib": 0,
//   "usable_fraction": 0.905,
//   "workload": {"rate": 10, "burstiness": 1, "requests": 1000, "seed": 0, "trace": ""},
//   "policies": ["static", "fixed", ...],
//   "engine": {"max_num_batched_tokens": 2048, "max_num_seqs": 256, "max_model_len": 2048},
//   "experts": {"expert_offload_limit": 10, "fixed_offload": 6,
//               "evict_below": 2, "restore_above": 9, "max_restores": 5},
//   "routing": {"source": "synthetic", "ranking": "", "skew": 0.6, "cross_layer_correlation": 0.5,
//   "locality": 0.9, "temporal_sigma": 0.3,
//               "drift": 0, "calibration_tokens": 8192, "temporal_period": 8},
//   "predictor": {"kind": "cross-layer", "accuracy": 0.9},
//   "expert_precision": "bf16", "moe_kernel": "paged",
//   "runs": [{"label": "fate", "policy": "fixed", "moe_kernel": "paged"}, ...]
// }
// expert_precision: bf16, int8 or int4, how routed experts are stored on the host, copied and paged;
// moe_kernel: paged or gather (gpu.hpp, MoeKernel); runs: labelled runs instead of `policies`, each label
// once. The GPU count (tensor parallelism) comes with the GPU profile ("gpu": "8x-rtx5090").
// weights: a Hugging Face checkpoint directory (engine/checkpoint.hpp) whose config.json replaces `model`
// (one config may not name both); the cuda backend serves its weights, the simulator reads only its shapes.
// routing.source: "synthetic", "model" (the GPU's router; refused by the simulator) or a routing record.
// Backend defaults: where no config, named scenario or flag names the GPU or the routing source, the
// backend's defaults apply (apply_backend_defaults): sim rtx5090 and synthetic, cuda h200 and model.
//
// Named scenarios (`--scenario NAME`, reference_engine/data/scenarios/NAME.json) wrap a config with what
// the paper claims for that setting and what it leaves open:
// {"name": ..., "description": ..., "paper": ..., "choices": ..., "sweep": {"rates": [...]},
//  "config": {...}}
// Precedence: defaults < --scenario < --config < flags.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/gpu.hpp"
#include "engine/memory_plan.hpp"
#include "engine/model.hpp"
#include "engine/routing.hpp"
#include "engine/scheduler.hpp"

namespace amoeba::engine {

// The accepted range of every setting, one table for --config and the flags (docs/engine.md lists them with
// what happens at each edge). Counts are bounded so that a run's memory and time stay finite.
struct RealRange {
  double min, max;
};
struct CountRange {
  std::uint64_t min, max;
};
namespace ranges {
inline constexpr RealRange kRate{1e-6, 1e6};  // req/s; arrivals must also stay <= kMaxArrivalS
inline constexpr RealRange kBurstiness{1e-3, 1e3};
inline constexpr CountRange kRequests{1, 10'000'000};
inline constexpr CountRange kSeed{0, ~std::uint64_t{0}};
// 0 = no cap; a positive cap below the smallest GPU profile (64 MiB) would leave no room for anything.
inline constexpr RealRange kMemoryCapGib{1.0 / 16, 1e6};
inline constexpr RealRange kUsableFraction{0.05, 1.0};
inline constexpr CountRange kMaxNumBatchedTokens{16, 1u << 20};
inline constexpr CountRange kMaxNumSeqs{1, 65536};
inline constexpr CountRange kMaxModelLen{16, 1u << 20};
inline constexpr CountRange kOffload{0, 65536};  // expert_offload_limit, fixed_offload
inline constexpr CountRange kThreshold{0, 1u << 20};
inline constexpr RealRange kSkew{0.0, 8.0};
inline constexpr RealRange kUnit{0.0, 1.0};  // cross_layer_correlation, locality, drift, accuracy
inline constexpr RealRange kTemporalSigma{0.0, 4.0};
inline constexpr CountRange kCalibrationTokens{1, 1u << 24};
inline constexpr CountRange kTemporalPeriod{1, 1u << 20};
inline constexpr CountRange kTp{1, 8};  // --tp: GPUs of one host
}  // namespace ranges
// One labelled run of an ablation: a policy and the MoE kernel it runs with.
struct RunVariant {
  std::string label, policy;
  std::optional<MoeKernel> moe_kernel;  // unset: the scenario's
};

struct Scenario {
  std::string name;             // the named scenario it started from ("" if none)
  std::string backend = "sim";  // a name from the backend table (policy_dispatch.hpp)
  std::string model = "qwen1.5-moe-a2.7b";
  std::string weights;  // a checkpoint directory; set: the model is its config.json's, `model` is unused
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
  // Where routing comes from: "synthetic" (the routing model above, seeded), "model" (the checkpoint's
  // router, run by a GPU backend) or a routing record file (engine/routing_record.hpp) replayed step by step.
  std::string routing_source = "synthetic";
  // Expert statistics the policies rank by (amoeba.expert_stats, e.g. from `amoeba rank`); empty = a sample
  // of `calibration_tokens` tokens drawn from the routing model.
  std::string ranking;
  PredictorParams predictor{};
  ExpertPrecision expert_precision = ExpertPrecision::kBf16;
  MoeKernel moe_kernel = MoeKernel::kPaged;
  // Tensor parallelism of the cuda backend (--tp): GPUs 0..tp-1 of this machine, one rank each (TpGroup over
  // CudaBackend ranks, NCCL between them); 1: one GPU, today's backend. The simulator prices several GPUs
  // through a GPU profile of several (--gpu 8x-rtx5090) instead, so tp > 1 needs --backend cuda.
  std::uint32_t tp = 1;
  std::vector<RunVariant> runs;  // non-empty: these runs instead of `policies`
  // Whether a config, a named scenario or a flag set `gpu` / `routing_source`; where not, the backend's
  // defaults replace them (apply_backend_defaults).
  bool gpu_given = false, routing_given = false;

  // Fixed-cache offload per layer: the given value, else 10% of the layer's experts (rounded).
  std::uint32_t fixed_offload_for(std::uint32_t experts) const noexcept;
};

// Applies a JSON config on top of `base`; errors name "config.<field>".
Scenario parse_scenario(std::string_view json_text, const std::string& what, Scenario base = {});
// Checks ranges and cross-field rules (policy names, max_model_len against the token budget, routing "model"
// only on a backend with a router); throws ConfigError. Flags and --config are checked as they are read; this
// catches a Scenario built in code.
void validate_scenario(const Scenario& s);
// Where the settings named no GPU (gpu_given) or routing source (routing_given), sets the backend's defaults
// (BackendEntry::gpu, ::routing: sim rtx5090 and synthetic, cuda h200 and model). Throws ConfigError for an
// unknown backend.
void apply_backend_defaults(Scenario& s);
// Refuses routing "model" on a backend without a router (the simulator), naming --routing.
void check_routing_source(const Scenario& s);
// What reports call the model: the catalog name or model file, or "checkpoint DIR" with --weights.
std::string model_label(const Scenario& s);
// What ablate runs: `runs` if given, else one run per policy (labelled by the policy) with the scenario's
// MoE kernel.
std::vector<RunVariant> scenario_runs(const Scenario& s);

// A named scenario: the config it applies and what the paper says about that setting.
struct NamedScenario {
  std::string name, description, paper, choices;
  std::vector<double> sweep_rates;  // request rates docs/reproducing.md sweeps (may be empty)
  std::string config_json;          // the "config" object, applied with parse_scenario
};
NamedScenario parse_named_scenario(std::string_view json_text, const std::string& what);
const std::vector<NamedScenario>& scenario_catalog();
// Throws ConfigError("--scenario", name, "unknown scenario (known: ...)").
const NamedScenario& find_scenario(const std::string& name);
// defaults < the named scenario: the Scenario it describes (name set).
Scenario apply_named_scenario(const NamedScenario& n, Scenario base = {});
// "must be ... in [min, max]" for error messages, the same words for flags and config fields.
std::string range_rule(RealRange r);
std::string range_rule(CountRange r);
std::string memory_cap_rule();
// GiB -> bytes for the memory cap (0 stays 0 = no cap), and bytes -> GiB.
std::uint64_t memory_cap_bytes(double gib);
double memory_gib(std::uint64_t bytes);
// The scenario as JSON (written into ablate's output). With a trace, the workload holds only the seed and the
// trace: the generator's rate and count did not run, and the JSON stays a valid config.
std::string scenario_to_json(const Scenario& s, int indent = 2);

}  // namespace amoeba::engine
