// The step contract (DESIGN §3.7): what the engine hands a backend for one forward pass and what it gets
// back. Host-only C++20 and CUDA-free; the simulator (reference_engine/engine/sim_backend.hpp) and a GPU
// backend are two models of it (amoeba/engine/backend.hpp) and neither knows the other.
//
//   Engine::step():
//     plan    = scheduler.schedule()                   // StepBatch: decode sequences and prefill chunks with
//                                                      // their KV page lists; the shortfall R_b
//     changes = adjuster.adjust({R_b, F_b}, pool)      // evictions; restores with reserved pages
//     routing.begin_step(batch)                        // the synthetic or recorded choices of this step
//     backend.forward({batch, changes, residency, pool, routing}, result)
//         per MoE layer l: copies = LoadPlanner (the one prefetch rule, amoeba/loader/load_planner.hpp)
//                          attention(l); route(l); wait for the copies l's MoE needs; moe(l)
//     adjuster.observe(result.routed_at(l)) for every l  // routing is an OUTPUT: a real router decides it
//     adjuster.commit(changes)                         // evicted pages return only now
//     scheduler.complete(plan)                         // tokens out; finished requests' pages back
#pragma once

#include <cassert>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "amoeba/pool/page_kinds.hpp"

namespace amoeba {

// ---- the batch of one step

// One sequence's share of a step. Its KV pages are laid out block-major: the page of 16-token block b at
// attention layer a is kv_pages[b * attention_layers + a]; they cover context_before + new_tokens tokens.
struct SequenceStep {
  std::uint64_t request = 0;         // request id, also the pool owner of its pages
  std::uint32_t context_before = 0;  // tokens whose KV was computed by earlier steps
  std::uint32_t new_tokens = 0;      // tokens computed now: 1 for decode, a prefill chunk otherwise
  bool samples = false;              // the step reaches its last known token, so the forward samples one
  std::span<const PageHandle> kv_pages;
  // Hybrid models: one SSM page per linear-attention layer, then one conv page per linear-attention layer.
  std::span<const PageHandle> state_pages;

  std::uint32_t context_after() const noexcept { return context_before + new_tokens; }
};

// Decode sequences and prefill chunks of one step, in the scheduler's order (running sequences first, in
// admission order, then newly admitted ones).
struct StepBatch {
  std::vector<SequenceStep> seqs;
  std::uint64_t tokens = 0;            // sum of new_tokens
  std::uint64_t sampling_seqs = 0;     // sequences with samples == true
  std::uint32_t attention_layers = 0;  // the stride of every kv_pages list
  std::uint32_t tokens_per_kv_page = 16;

  bool empty() const noexcept { return seqs.empty(); }
  std::size_t size() const noexcept { return seqs.size(); }
};

// ---- where routing comes from

enum class RoutingKind : std::uint8_t {
  kModel,      // the checkpoint's router, run by the backend inside the forward (GPU backends only)
  kSynthetic,  // a seeded routing model: the simulator always, a GPU backend on request
  kRecorded,   // a routing trace recorded from a real run, replayed step by step
};
constexpr std::string_view to_string(RoutingKind k) noexcept {
  switch (k) {
    case RoutingKind::kModel:
      return "model";
    case RoutingKind::kSynthetic:
      return "synthetic";
    case RoutingKind::kRecorded:
      return "recorded";
  }
  return "?";
}

// Where the expert choices of each MoE layer come from. Chosen at run time (a flag), so it is an interface
// rather than a template parameter; it is called once per step and once per layer, not per token.
// The engine calls begin_step() once before each forward. A backend with its own router may ignore a kModel
// source; every other backend reads layer_experts(). Sources that know the choices ahead (synthetic,
// recorded) also let a simulated predictor peek at a later layer.
class RoutingSource {
 public:
  virtual ~RoutingSource() = default;
  virtual RoutingKind kind() const noexcept = 0;
  virtual std::uint32_t layers() const noexcept = 0;   // MoE layers
  virtual std::uint32_t experts() const noexcept = 0;  // routed experts per layer
  // Draws or reads this step's choices for every MoE layer.
  virtual void begin_step(const StepBatch& batch) = 0;
  // The distinct experts the tokens of MoE layer `layer` pick this step, ascending. Precondition:
  // kind() != kModel, begin_step() called for this step, layer < layers().
  virtual std::span<const std::uint32_t> layer_experts(std::uint32_t layer) const = 0;
};

// ---- what a forward returns

// The counters and times of one forward (StepResult without its routing).
struct StepCounters {
  // Copies, from the LoadPlanner's plan.
  std::uint64_t h2d_bytes = 0;
  std::uint64_t copy_calls = 0;       // host-to-device copy calls (a restore is 3, a buffered expert 1)
  std::uint64_t restores_copied = 0;  // experts written into their reserved pages
  std::uint64_t prefetches = 0;       // predicted experts copied into a load buffer
  std::uint64_t on_demand = 0;        // missed experts loaded after routing (the MoE waits for them)

  // Lookups of routed experts: touches = hits + prefetched + misses.
  std::uint64_t expert_touches = 0;
  std::uint64_t expert_hits = 0;        // resident (an expert evicted this step still counts)
  std::uint64_t expert_prefetched = 0;  // restored this step or predicted in time
  std::uint64_t expert_misses = 0;      // loaded on demand
  std::uint64_t wasted_prefetches = 0;  // predicted, not routed

  // Times in seconds (simulated by a cost model, or measured).
  double step_s = 0;       // the whole forward
  double compute_s = 0;    // compute stream busy (attention + moe + dense + overhead)
  double attention_s = 0;  // attention (or linear attention) of every layer
  double moe_s = 0;        // MoE layers
  double dense_s = 0;      // dense FFN layers and the LM head
  double copy_s = 0;       // copy engine busy
  double stall_s = 0;      // compute waiting for copies
  // Tensor parallelism: the step's all-reduces (inside attention_s, moe_s and dense_s, not beside them);
  // 0 on one GPU.
  double allreduce_s = 0;
  double host_s = 0;  // measured backends: the forward's host time until it waits for the GPU at its end
                      // (planning, launches, waits for the router's choices); 0 when simulated
};

struct StepResult : StepCounters {
  // The routing the forward actually used: distinct experts per MoE layer, ascending (CSR:
  // routed[routed_offsets[l] .. routed_offsets[l + 1])). The adjuster observes it after the forward.
  std::vector<std::uint32_t> routed;
  std::vector<std::uint32_t> routed_offsets;

  std::span<const std::uint32_t> routed_at(std::uint32_t layer) const noexcept {
    assert(layer + 1 < routed_offsets.size());
    return std::span<const std::uint32_t>(routed).subspan(routed_offsets[layer],
                                                          routed_offsets[layer + 1] - routed_offsets[layer]);
  }
  std::uint32_t routed_layers() const noexcept {
    return routed_offsets.empty() ? 0 : static_cast<std::uint32_t>(routed_offsets.size() - 1);
  }
  // Clears every field and keeps the vectors' capacity (a result is reused across steps).
  void clear() noexcept {
    routed.clear();
    routed_offsets.clear();
    static_cast<StepCounters&>(*this) = StepCounters{};
  }
  // Appends MoE layer `layer`'s routed experts; layers must be appended in order 0, 1, ...
  void add_routed(std::span<const std::uint32_t> experts) {
    if (routed_offsets.empty()) routed_offsets.push_back(0);
    routed.insert(routed.end(), experts.begin(), experts.end());
    routed_offsets.push_back(static_cast<std::uint32_t>(routed.size()));
  }
};

}  // namespace amoeba
