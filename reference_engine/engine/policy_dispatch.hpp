// The one place where run-time names become compiled stacks (STYLE: a dispatch table, not scattered
// switches). Each policy entry names an Adjuster<Evict, Restore, Capacity> from amoeba/policies/stacks.hpp;
// each backend entry names a model of the `backend` concept (amoeba/engine/backend.hpp). The runner
// instantiates Engine<Pool, Adjuster, Backend> for the pair, with MoePool or HybridMoePool chosen by the
// model.
//
// Backends (--backend):
//   sim          simulated GPU: the cost model of sim_backend.hpp over the LoadPlanner's copies (no GPU)
//   cuda         an NVIDIA GPU: CudaBackend (cuda_backend.hpp), the real kernels and copies, measured times;
//                only in a build with the CUDA backend (elsewhere its constructor refuses, naming --backend)
//
// Policies (--policy, --policies):
//   static       every expert resident, nothing moves (vLLM / SGLang)
//   fixed        fixed resident prefix per layer, misses from the load buffer (Fate)
//   lru, lfu     fixed capacity, a missed expert is admitted and swaps out the LRU / LFU one (CoMoE-style)
//   elastic      the paper's hysteresis rules, rank-coldest out, rank-hottest back (Rimuru)
//   elastic-lru  cross variant: elastic capacity with LRU victims, restores by rank
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "amoeba/engine/step.hpp"
#include "amoeba/expert/expert_ranker.hpp"
#include "engine/checkpoint.hpp"
#include "engine/gpu.hpp"
#include "engine/memory_plan.hpp"
#include "engine/metrics.hpp"
#include "engine/model.hpp"
#include "engine/sim_backend.hpp"
#include "engine/workload.hpp"

namespace amoeba::engine {

struct Scenario;
struct RunVariant;

enum class CapacityKind : std::uint8_t { kStatic, kFixed, kElastic };
enum class BackendKind : std::uint8_t { kSim, kCuda };

struct BackendEntry {
  std::string_view name;
  std::string_view description;
  BackendKind kind;
  bool simulated;  // its times come from a cost model, not a measurement
  // Defaults where the settings name none (apply_backend_defaults): the GPU profile and the routing source.
  std::string_view gpu, routing;
};
std::span<const BackendEntry> backend_table();
// Throws ConfigError("--backend", name, "unknown backend (known: ...)").
const BackendEntry& find_backend(const std::string& name);

class RoutingRecorder;
struct RoutingRecord;

// Where a run stands, for progress reports.
struct RunProgress {
  std::uint64_t finished_requests = 0, total_requests = 0;
  std::uint64_t forward_steps = 0;
  double clock_s = 0;  // the engine's clock (simulated, or measured: engine.hpp)
};

struct RunOptions {
  bool record_timeline = false;
  RoutingRecorder* recorder = nullptr;  // receives the routing of every forward step
  bool check_conservation = true;       // run Engine::drain() at the end; a violation throws std::logic_error
  // Called after every step (cheap calls: the receiver decides how often to draw anything).
  std::function<void(const RunProgress&)> progress;
  // Called after every forward step with its batch and result (the calibration harness turns them into
  // samples: calibration_harness.hpp).
  std::function<void(const StepBatch&, const StepResult&)> observe_forward;
  // When set, makes the routing source instead of the scenario's (the calibration harness's chosen
  // distinct-expert counts). Its shape must be the model's and its kind not kModel when the scenario's
  // routing source names a synthetic or recorded one (the GPU backend reads the sets it hands out).
  std::function<std::unique_ptr<RoutingSource>()> make_routing;
  // When set (with record_timeline), the simulator with this cost model prices every forward of the run on
  // its very input (EngineOptions::price_with; the timeline's priced_ms). Needs routing known on the host.
  std::optional<CostModelParams> price_with;
};

// Everything a run needs, resolved from a Scenario (names looked up, memory planned).
struct RunSetup {
  const Scenario* scenario = nullptr;
  ModelSpec model;  // one GPU's shard (shard_model): the engine plans and prices one GPU of gpu.gpus
  GpuProfile gpu;
  CostModelParams cost;
  PageGeometry geometry;
  MemoryPlan memory;
  std::string policy;
  std::string label;  // what the run is called in results (the policy, or a RunVariant's label)
  MoeKernel moe_kernel = MoeKernel::kPaged;
  CapacityKind capacity = CapacityKind::kStatic;
  BackendKind backend = BackendKind::kSim;
  std::uint32_t offload_limit = 0;       // per layer; sizes the load buffers
  std::uint32_t resident_per_layer = 0;  // initial
  const std::vector<Request>* trace = nullptr;
  RunOptions options;
  // Loaded and checked against the model by prepare_run (before anything runs): the record to replay when
  // the scenario's routing source is a file, the expert statistics when it names a ranking file.
  std::shared_ptr<const RoutingRecord> routing_record;
  std::shared_ptr<const ExpertRanker> ranking;
  // The Hugging Face configuration the model comes from: the checkpoint's (scenario `weights`) or, for the
  // cuda backend, the catalog model's (hf_config_for); null for a simulated catalog model.
  std::shared_ptr<const HfMoeConfig> hf_model;
  RoutingKind routing = RoutingKind::kSynthetic;  // what the scenario's routing source is
};

struct PolicyEntry {
  std::string_view name;
  std::string_view description;
  CapacityKind capacity;
  RunResult (*run)(const RunSetup&);
};

std::span<const PolicyEntry> policy_table();
// Throws ConfigError("--policy", name, "unknown policy (known: ...)").
const PolicyEntry& find_policy(const std::string& name);
std::vector<std::string> all_policy_names();

// Resolves names and plans memory for one policy (throws ConfigError when it cannot fit).
RunSetup prepare_run(const Scenario& s, const std::string& policy, const std::vector<Request>& trace,
                     const RunOptions& options);
RunSetup prepare_run(const Scenario& s, const RunVariant& run, const std::vector<Request>& trace,
                     const RunOptions& options);
// Every run of the scenario (scenario_runs), planned before any runs; its ranking file and routing record are
// read and checked once for all of them.
std::vector<RunSetup> prepare_runs(const Scenario& s, const std::vector<Request>& trace,
                                   const RunOptions& options);
RunResult run_policy(const RunSetup& setup);

// The simulator of `setup` (its model, GPU, predictor, offload limit, seed and MoE kernel) pricing with
// `cost`: the simulated backend itself (cost = setup.cost), a measured run's pricer (RunOptions::price_with),
// the calibration's simulated copy probes.
SimBackend make_simulator(const RunSetup& setup, const CostModelParams& cost);

// The requests a scenario runs: its trace file, or ShareGPT-like requests from its seed.
std::vector<Request> scenario_requests(const Scenario& s);

}  // namespace amoeba::engine
