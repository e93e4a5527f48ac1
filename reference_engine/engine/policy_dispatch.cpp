// The dispatch tables and the runner that instantiates Engine<Pool, Adjuster, Backend>; see
// policy_dispatch.hpp.
#include "engine/policy_dispatch.hpp"

#include <array>
#include <memory>
#include <optional>
#include <stdexcept>
#include <type_traits>

#include "amoeba/core/errors.hpp"
#include "amoeba/expert/expert_ranker.hpp"
#include "amoeba/expert/ranker_json.hpp"
#include "amoeba/policies/stacks.hpp"
#include "amoeba/pool/tiered_page_pool.hpp"
#include "engine/checkpoint.hpp"
#include "engine/cuda_backend.hpp"
#include "engine/engine.hpp"
#include "engine/json_fields.hpp"
#include "engine/model_weights.hpp"
#include "engine/pool_layout.hpp"
#include "engine/routing_record.hpp"
#include "engine/routing_source.hpp"
#include "engine/scenario.hpp"
#include "engine/sim_backend.hpp"
#include "engine/tp_collective.hpp"
#include "engine/tp_group.hpp"
#include "engine/tp_shard.hpp"
#include "moe/moe_shape.hpp"

namespace amoeba::engine {

namespace {

template <class Adj>
typename Adj::capacity_rule_type capacity_for(const RunSetup& s) {
  using C = typename Adj::capacity_rule_type;
  if constexpr (std::is_same_v<C, policies::StaticCapacity>) {
    return C{};
  } else if constexpr (std::is_same_v<C, policies::FixedCapacity>) {
    C c;
    c.resident_per_layer = s.resident_per_layer;
    return c;
  } else {
    static_assert(std::is_same_v<C, policies::ElasticHysteresis>, "no capacity setup for this rule");
    C c;
    c.params.evict_below = s.scenario->evict_below;
    c.params.restore_above = s.scenario->restore_above;
    c.params.max_restores = s.scenario->max_restores;
    c.initial_resident_per_layer = s.resident_per_layer;
    return c;
  }
}

}  // namespace

SimBackend make_simulator(const RunSetup& s, const CostModelParams& cost) {
  return SimBackend(s.model, s.gpu, cost, s.scenario->predictor, s.offload_limit, s.scenario->seed,
                    s.moe_kernel);
}

namespace {

template <class Backend>
Backend make_backend(const RunSetup& s);
template <>
SimBackend make_backend<SimBackend>(const RunSetup& s) {
  return make_simulator(s, s.cost);
}
// The GPU: the setup's model, pool and limits; the checkpoint's weights, or random ones from the seed; prompt
// tokens drawn from the seed (a trace has lengths, not tokens).
CudaBackend make_cuda_backend(const RunSetup& s, TpShard shard, std::shared_ptr<TpCollective> collective,
                              std::shared_ptr<const ModelWeights> full) {
  const Scenario& sc = *s.scenario;
  CudaBackendConfig c;
  c.shard = shard;
  c.collective = std::move(collective);
  c.full_weights = std::move(full);
  c.device = static_cast<int>(shard.rank);
  c.model = *s.hf_model;
  c.checkpoint_dir = sc.weights;
  c.seed = sc.seed;
  c.geometry = s.geometry;
  c.pool_bytes = s.memory.pool_bytes;
  c.load_buffer_experts = s.offload_limit;
  c.max_batched_tokens = sc.scheduler.max_num_batched_tokens;
  c.max_seqs = sc.scheduler.max_num_seqs;
  c.routing = s.routing;
  c.expert_precision = s.model.expert_precision;
  const std::uint64_t seed = sc.seed;
  const std::uint32_t vocab = c.model.vocab_size;
  return CudaBackend(c, [seed, vocab](std::uint64_t request, std::uint32_t position) {
    return synthetic_prompt_token(seed, vocab, request, position);
  });
}
template <>
CudaBackend make_backend<CudaBackend>(const RunSetup& s) {
  return make_cuda_backend(s, TpShard{}, nullptr, nullptr);
}

// --tp N: GPUs 0..N-1, one CudaBackend rank each over the rank's shard of one set of weights, summing through
// one NCCL communicator per rank.
template <>
TpGroup<CudaBackend> make_backend<TpGroup<CudaBackend>>(const RunSetup& s) {
  const Scenario& sc = *s.scenario;
  const std::uint32_t tp = sc.tp;
  const std::shared_ptr<const ModelWeights> full = serving_weights(*s.hf_model, sc.weights, sc.seed);
  std::vector<int> devices(tp);
  for (std::uint32_t r = 0; r < tp; ++r) devices[r] = int(r);
  const std::vector<std::shared_ptr<TpCollective>> comms = nccl_group(devices);
  std::vector<std::unique_ptr<CudaBackend>> ranks;
  for (std::uint32_t r = 0; r < tp; ++r)
    ranks.push_back(std::make_unique<CudaBackend>(make_cuda_backend(s, TpShard{tp, r}, comms[r], full)));
  return TpGroup<CudaBackend>(std::move(ranks));
}

// What a GPU backend took from its device (a tensor-parallel group: rank 0's GPU).
const CudaMemoryReport& gpu_memory(const CudaBackend& b) {
  return b.memory();
}
const CudaMemoryReport& gpu_memory(const TpGroup<CudaBackend>& g) {
  return g.rank(0).memory();
}

template <class Pool, class Adj, class Backend>
RunResult run_engine(const RunSetup& s) {
  const Scenario& sc = *s.scenario;
  const std::uint32_t layers = s.model.moe_layers(), experts = s.model.num_experts;
  // Without a ranking file, the offline ranking sample and the live routing come from the same synthetic
  // model (same seed); `drift` moves the live ranking away from the sample.
  RoutingModel routing(layers, experts, s.model.top_k, sc.routing, sc.seed);
  std::optional<ExpertRanker> ranker;
  if (s.ranking) {
    ranker = *s.ranking;
  } else if (s.routing == RoutingKind::kModel) {
    // The router's statistics are unknown before the run: every expert ranks alike (rank by a recorded run's
    // statistics with --ranking).
    ranker = ExpertRanker::uniform(layers, experts);
  } else {
    const std::vector<double> counts = routing.calibration_counts(sc.routing.calibration_tokens);
    std::vector<std::vector<double>> probs(layers, std::vector<double>(experts));
    for (std::uint32_t l = 0; l < layers; ++l)
      for (std::uint32_t e = 0; e < experts; ++e)
        probs[l][e] = counts[std::size_t(l) * experts + e] / double(sc.routing.calibration_tokens);
    ranker = ExpertRanker::from_probabilities(probs, "calibration sample");
  }
  std::unique_ptr<RoutingSource> source;
  if (s.options.make_routing)
    source = s.options.make_routing();
  else if (s.routing_record)
    source = replay(*s.routing_record, layers, experts, s.model.top_k, sc.routing_source);
  else if (s.routing == RoutingKind::kModel)
    source = std::make_unique<ModelRouting>(layers, experts);
  else
    source = std::make_unique<SyntheticRouting>(std::move(routing));

  Pool pool(ArenaSpan{nullptr, s.memory.pool_bytes}, pool_layout<Pool>(s.geometry));
  AdjusterConfig acfg;
  acfg.expert_offload_limit = s.capacity == CapacityKind::kStatic ? kNoOffloadLimit : s.offload_limit;
  Adj adj(std::move(*ranker), acfg, capacity_for<Adj>(s));
  EngineOptions eo;
  eo.record_timeline = s.options.record_timeline;
  if (s.options.price_with) {
    if (source->kind() == RoutingKind::kModel)
      throw ConfigError("--routing", "model",
                        "pricing each measured step with the simulator needs the routing known on the host "
                        "(synthetic or recorded)");
    eo.price_with = std::make_shared<SimBackend>(make_simulator(s, *s.options.price_with));
  }
  Engine<Pool, Adj, Backend> engine(s.model, s.geometry, sc.scheduler, std::move(pool), std::move(adj),
                                    make_backend<Backend>(s), std::move(source), *s.trace, eo);
  RunProgress progress;
  progress.total_requests = engine.sequences().size();
  std::uint64_t forwards = 0;
  while (engine.step()) {
    if (s.options.recorder && engine.last_step().routed_layers() > 0)
      s.options.recorder->add(engine.last_plan().batch, engine.last_step());
    if (s.options.observe_forward && engine.forward_steps() != forwards)
      s.options.observe_forward(engine.last_plan().batch, engine.last_step());
    forwards = engine.forward_steps();
    if (s.options.progress) {
      progress.finished_requests = engine.finished_requests();
      progress.forward_steps = engine.forward_steps();
      progress.clock_s = engine.now();
      s.options.progress(progress);
    }
  }
  RunResult r = engine.result();
  r.policy = s.label;
  r.pool_bytes = s.memory.pool_bytes;
  r.initial_kv_bytes = s.memory.initial_kv_bytes();
  r.load_buffer_experts = s.offload_limit;
  if constexpr (requires { gpu_memory(engine.backend()); }) {
    const CudaMemoryReport& m = gpu_memory(engine.backend());
    r.device_free_before = m.device_free_before;
    r.device_free_after_setup = m.device_free_after_setup;
    r.device_free_end = m.device_free_now();
  }
  if (s.options.check_conservation)
    if (auto err = engine.drain())
      throw std::logic_error("conservation check failed (" + s.policy + "): " + *err);
  return r;
}

template <class Pool, class Adj>
RunResult run_with_pool(const RunSetup& s) {
  switch (s.backend) {
    case BackendKind::kSim:
      return run_engine<Pool, Adj, SimBackend>(s);
    case BackendKind::kCuda:
      // The GPU backend serves Qwen MoE models, which have no linear-attention state (prepare_run refused
      // the others), so it is instantiated for MoePool only.
      if constexpr (std::is_same_v<Pool, MoePool>) {
        if (s.scenario->tp > 1) return run_engine<Pool, Adj, TpGroup<CudaBackend>>(s);
        return run_engine<Pool, Adj, CudaBackend>(s);
      }
      break;
  }
  throw std::logic_error("no runner for this backend and pool");
}

template <class Adj>
RunResult run_stack(const RunSetup& s) {
  if (s.model.is_hybrid()) return run_with_pool<HybridMoePool, Adj>(s);
  return run_with_pool<MoePool, Adj>(s);
}

constexpr std::array<BackendEntry, 2> kBackends{{
    {"sim", "simulated GPU: a cost model over the loader's copy plan (no GPU is used)", BackendKind::kSim,
     true, "rtx5090", "synthetic"},
    {"cuda", "an NVIDIA GPU: the real kernels and copies (needs a build with the CUDA backend)",
     BackendKind::kCuda, false, "h200", "model"},
}};

constexpr std::array<PolicyEntry, 6> kTable{{
    {"static", "every expert resident, nothing moves (vLLM/SGLang)", CapacityKind::kStatic,
     &run_stack<policies::StaticAdjuster>},
    {"fixed", "fixed resident prefix per layer, misses from the load buffer (Fate)", CapacityKind::kFixed,
     &run_stack<policies::FixedCacheAdjuster>},
    {"lru", "fixed capacity, missed experts admitted, LRU victim (CoMoE-style)", CapacityKind::kFixed,
     &run_stack<policies::LruCacheAdjuster>},
    {"lfu", "fixed capacity, missed experts admitted, LFU victim (CoMoE-style)", CapacityKind::kFixed,
     &run_stack<policies::LfuCacheAdjuster>},
    {"elastic", "hysteresis on R_b/F_b, rank-coldest out, rank-hottest back (Rimuru)", CapacityKind::kElastic,
     &run_stack<policies::ElasticAdjuster>},
    {"elastic-lru", "cross variant: elastic capacity, LRU victims, restores by rank", CapacityKind::kElastic,
     &run_stack<policies::ElasticLruAdjuster>},
}};

}  // namespace

std::span<const PolicyEntry> policy_table() {
  return kTable;
}

std::span<const BackendEntry> backend_table() {
  return kBackends;
}

// The entry of `table` called `name`, or ConfigError(flag, name, "unknown <what> (known: ...)").
template <class Entry, std::size_t N>
const Entry& find_by_name(const std::array<Entry, N>& table, const std::string& name, const char* flag,
                          const char* what) {
  std::string known;
  for (const Entry& e : table) {
    if (e.name == name) return e;
    known += (known.empty() ? "" : ", ") + std::string(e.name);
  }
  throw ConfigError(flag, name, std::string("unknown ") + what + " (known: " + known + ")");
}

const BackendEntry& find_backend(const std::string& name) {
  return find_by_name(kBackends, name, "--backend", "backend");
}

const PolicyEntry& find_policy(const std::string& name) {
  return find_by_name(kTable, name, "--policy", "policy");
}

std::vector<std::string> all_policy_names() {
  std::vector<std::string> v;
  for (const PolicyEntry& e : kTable) v.emplace_back(e.name);
  return v;
}

RunSetup prepare_run(const Scenario& sc, const std::string& policy, const std::vector<Request>& trace,
                     const RunOptions& options) {
  return prepare_run(sc, RunVariant{policy, policy, std::nullopt}, trace, options);
}

namespace {
// Reads the scenario's ranking file and routing record (when it names them) into `s`, checked against its
// model.
void load_routing_inputs(const Scenario& sc, RunSetup& s) {
  const std::uint32_t layers = s.model.moe_layers(), e = s.model.num_experts;
  if (!sc.ranking.empty()) {
    auto r = std::make_shared<ExpertRanker>(
        expert_ranker_from_json_string(read_text_file(sc.ranking, "--ranking"), sc.ranking));
    if (r->layers() != layers || r->experts_per_layer() != e)
      throw ConfigError("--ranking", sc.ranking,
                        "ranks " + std::to_string(r->layers()) + " x " +
                            std::to_string(r->experts_per_layer()) + " experts; the model has " +
                            std::to_string(layers) + " MoE layers x " + std::to_string(e));
    s.ranking = std::move(r);
  }
  check_routing_source(sc);
  if (sc.routing_source != "synthetic" && sc.routing_source != "model") {
    auto rec = std::make_shared<RoutingRecord>(read_routing_record(sc.routing_source));
    check_record_shape(*rec, layers, e, sc.routing_source);
    s.routing_record = std::move(rec);
  }
}

// The model a run plans and runs: the checkpoint's config.json (scenario `weights`; its headers are checked,
// no tensor is read), else the catalog's, which the cuda backend takes through its Hugging Face configuration
// so that the memory plan and the forward see one set of shapes. `shared`: the scenario's first run, whose
// configuration the others reuse.
ModelSpec resolve_model(const Scenario& sc, const BackendEntry& backend, const RunSetup* shared,
                        std::shared_ptr<const HfMoeConfig>& hf) {
  if (!sc.weights.empty()) {
    hf = shared ? shared->hf_model : std::make_shared<const HfMoeConfig>(open_checkpoint(sc.weights).config);
    return hf->to_model_spec(model_label(sc));
  }
  ModelSpec m = find_model(sc.model);
  if (backend.kind != BackendKind::kCuda) return m;
  hf = shared ? shared->hf_model : std::make_shared<const HfMoeConfig>(hf_config_for(m, "--model"));
  return hf->to_model_spec(m.name);
}

// What the cuda backend runs: one GPU, the paged MoE kernel, a model without linear attention.
void check_cuda_setup(const Scenario& sc, const RunVariant& run, const RunSetup& s, const ModelSpec& model) {
  if (s.gpu.gpus != 1)
    throw ConfigError(
        "--gpu", sc.gpu,
        "the cuda backend runs on one GPU; this profile describes " + std::to_string(s.gpu.gpus));
  if (s.moe_kernel != MoeKernel::kPaged)
    throw ConfigError(run.moe_kernel ? "config.runs (" + run.label + ").moe_kernel" : "--moe-kernel",
                      std::string(to_string(s.moe_kernel)),
                      "the cuda backend runs the paged MoE kernel only (gather is a modelled variant)");
  if (model.is_hybrid())
    throw ConfigError("--model", sc.model, "the cuda backend serves Qwen2-MoE and Qwen3-MoE models only");
}

// The paged MoE kernel splits each GPU's F into kernels::kMoeRowBlock-row blocks (PagedMoe::can_implement):
// a model, or a tensor-parallel rank's slice of it, whose F is not a multiple would fail once the GPUs are
// set up, so it is refused here, before any is touched. `rank`: one GPU's shapes (the model's at tp 1).
void check_moe_blocks(const Scenario& sc, const ModelSpec& model, const ModelSpec& rank) {
  const std::uint32_t f = rank.moe_intermediate_size, block = kernels::kMoeRowBlock;
  if (f % block == 0) return;
  const std::string rule = " must be a multiple of " + std::to_string(block) +
                           " (the paged MoE kernel's tiles split each rank's F into " +
                           std::to_string(block) + "-row blocks)";
  if (sc.tp > 1)
    throw ConfigError("--tp", std::to_string(sc.tp),
                      "config.moe_intermediate_size / --tp = " + std::to_string(model.moe_intermediate_size) +
                          " / " + std::to_string(sc.tp) + " = " + std::to_string(f) + rule);
  throw ConfigError("--model", sc.model, "config.moe_intermediate_size = " + std::to_string(f) + rule);
}

RunSetup prepare_one(const Scenario& sc, const RunVariant& run, const std::vector<Request>& trace,
                     const RunOptions& options, const RunSetup* shared) {
  const std::string& policy = run.policy;
  const PolicyEntry& entry = find_policy(policy);
  const BackendEntry& backend = find_backend(sc.backend);
  RunSetup s;
  s.backend = backend.kind;
  s.scenario = &sc;
  s.gpu = find_gpu(sc.gpu);
  s.label = run.label;
  s.moe_kernel = run.moe_kernel.value_or(sc.moe_kernel);
  const ModelSpec model = resolve_model(sc, backend, shared, s.hf_model);
  if (backend.kind == BackendKind::kCuda) check_cuda_setup(sc, run, s, model);
  if (backend.kind == BackendKind::kCuda && sc.tp > 1) {
    // One rank's shapes (every rank's are equal): what its pool, memory plan and engine see.
    s.model = tp_rank_model(*s.hf_model, TpShard{sc.tp, 0}, model.name);
    s.model.expert_precision = sc.expert_precision;
  } else {
    s.model = shard_model(model, s.gpu.gpus, sc.expert_precision, "gpu " + s.gpu.name + ".gpus");
  }
  if (backend.kind == BackendKind::kCuda) check_moe_blocks(sc, model, s.model);
  s.routing = sc.routing_source == "synthetic" ? RoutingKind::kSynthetic
              : sc.routing_source == "model"   ? RoutingKind::kModel
                                               : RoutingKind::kRecorded;
  s.cost = find_cost_model(sc.cost_model);
  s.geometry = page_geometry(s.model);
  s.policy = policy;
  s.capacity = entry.capacity;
  s.trace = &trace;
  s.options = options;
  const std::uint32_t e = s.model.num_experts;
  std::uint32_t min_res = e, max_res = e;
  switch (entry.capacity) {
    case CapacityKind::kStatic:
      s.offload_limit = 0;
      break;
    case CapacityKind::kFixed:
      s.offload_limit = sc.fixed_offload_for(e);
      min_res = max_res = e - s.offload_limit;
      break;
    case CapacityKind::kElastic:
      s.offload_limit = std::min(sc.expert_offload_limit, e);
      min_res = e - s.offload_limit;
      break;
  }
  for (const Request& r : trace)
    if (r.prompt_tokens + r.output_tokens > sc.scheduler.max_model_len)
      throw_config_error("trace request " + std::to_string(r.id), r.prompt_tokens + r.output_tokens,
                         "prompt + output tokens must be <= max_model_len (" +
                             std::to_string(sc.scheduler.max_model_len) + ")");
  if (shared) {  // the files of this scenario, read and checked once for all its runs
    s.ranking = shared->ranking;
    s.routing_record = shared->routing_record;
  } else {
    load_routing_inputs(sc, s);
  }
  s.memory =
      plan_memory(s.model, s.gpu, sc.memory, sc.scheduler.max_num_batched_tokens, sc.scheduler.max_num_seqs,
                  sc.scheduler.max_model_len, s.offload_limit, min_res, max_res, policy);
  s.resident_per_layer = s.memory.initial_resident_per_layer;
  return s;
}

}  // namespace

RunSetup prepare_run(const Scenario& sc, const RunVariant& run, const std::vector<Request>& trace,
                     const RunOptions& options) {
  return prepare_one(sc, run, trace, options, nullptr);
}

std::vector<RunSetup> prepare_runs(const Scenario& sc, const std::vector<Request>& trace,
                                   const RunOptions& options) {
  std::vector<RunSetup> out;
  for (const RunVariant& v : scenario_runs(sc))
    out.push_back(prepare_one(sc, v, trace, options, out.empty() ? nullptr : &out.front()));
  return out;
}

RunResult run_policy(const RunSetup& setup) {
  return find_policy(setup.policy).run(setup);
}

std::vector<Request> scenario_requests(const Scenario& s) {
  if (!s.trace.empty()) return read_trace(s.trace, TraceLimits{s.scheduler.max_model_len});
  ShareGptLikeParams p;
  p.rate = s.rate;
  p.burstiness = s.burstiness;
  p.requests = s.requests;
  p.seed = s.seed;
  p.max_total = std::min<std::uint32_t>(p.max_total, s.scheduler.max_model_len);
  p.max_prompt = std::min<std::uint32_t>(p.max_prompt, p.max_total - p.min_tokens);
  return generate_sharegpt_like(p);
}

}  // namespace amoeba::engine
