// SimBackend: the time one engine step takes on a simulated GPU, from a documented cost model (DESIGN §3.6).
// No GPU is used; every number it produces is simulated.
//
// Compute (one stream), per layer, a roofline with efficiency factors (CostModelParams):
//   time = max(bytes / (HBM bandwidth x memory efficiency), FLOPs / (bf16 rate x compute efficiency))
//          + per_layer_overhead
//   attention: bytes = attention weights + KV read (each scheduled sequence's context after the step);
//              FLOPs = 2 T x attention params + sum over sequences of 4 x new x (context before + new / 2) x
//              heads x head_dim (scores and values);
//   linear attention (hybrid): bytes = weights + 2 x state bytes per sequence (read and write);
//              FLOPs = 2 T x params + 4 T x value_heads x dk x dv;
//   MoE: bytes = distinct experts touched x 3 expert pages + shared experts + router;
//        FLOPs = 2 T x top_k x 3 x F x H + shared experts' 2 T x 3 x Fs x H;
//   dense FFN layers and the LM head (sampled sequences only) as dense GEMMs; plus step_overhead per step.
// Copies (one copy engine, FIFO, pinned host memory): each expert = copies_per_expert copies, each paying the
//   per-copy latency, bytes at the profile's H2D bandwidth x h2d_bandwidth_scale.
//   The queue for MoE layer m (restores into reserved pages first, then predicted offloaded experts into the
//   free load buffer, deduplicated) is issued when the previous layer's attention ends (the first at the
//   start of the step), so it overlaps the previous layer's compute; layer m's attention waits for it (the
//   page table flips only after the copies complete). Experts the router picks that are neither resident nor
//   fetched (misses) are copied after layer m's attention and its MoE waits for them (a stall). Evicted
//   experts stay usable until the forward ends (deferred eviction, DESIGN §3.3): they cost nothing here.
#pragma once

#include <cstdint>
#include <vector>

#include "amoeba/adjust/change_list.hpp"
#include "engine/gpu.hpp"
#include "engine/model.hpp"
#include "engine/random.hpp"
#include "engine/routing.hpp"
#include "engine/scheduler.hpp"

namespace amoeba::engine {

struct ForwardStats {
  double step_s = 0;
  double compute_s = 0;  // compute stream busy
  double copy_s = 0;     // copy engine busy
  double stall_s = 0;    // compute waiting for copies
  std::uint64_t h2d_bytes = 0;
  std::uint64_t expert_touches = 0;     // (layer, expert) pairs the router picked
  std::uint64_t expert_hits = 0;        // ... that were resident
  std::uint64_t expert_prefetched = 0;  // ... that were restored or predicted in time
  std::uint64_t expert_misses = 0;      // ... loaded on demand
  std::uint64_t wasted_prefetches = 0;  // predicted, not picked
};

// What the backend needs to know about one MoE layer's experts this step.
struct LayerExperts {
  const std::uint8_t* touched;    // [experts], 1 = the router picks it
  const std::uint8_t* resident;   // [experts], 1 = in GPU pages (evicted-this-step still counts)
  const std::uint8_t* restoring;  // [experts], 1 = a restore in this step's change list
};

class SimBackend {
 public:
  SimBackend(const ModelSpec& model, const GpuProfile& gpu, const CostModelParams& cost,
             const PredictorParams& predictor, std::uint32_t load_buffer_experts, std::uint64_t seed);

  // One forward pass of `plan`. `layers[m]` describes MoE layer m. Fills `stats`.
  void forward(const StepPlan& plan, const std::vector<LayerExperts>& layers, ForwardStats& stats);

  // Pure compute time of one layer kind, exposed for tests and docs.
  double attention_time(std::uint32_t layer, const StepPlan& plan) const;
  double moe_time(std::uint64_t tokens, std::uint64_t distinct_experts) const;
  double copy_time(std::uint64_t experts) const;
  double idle_step_s() const noexcept { return cost_.step_overhead_s; }

 private:
  double roofline(double bytes, double flops, double mem_eff, double comp_eff) const noexcept;

  ModelSpec model_;
  GpuProfile gpu_;
  CostModelParams cost_;
  PredictorParams predictor_;
  std::uint32_t buffer_experts_;
  Rng rng_;
  std::vector<std::uint8_t> predicted_;
};

}  // namespace amoeba::engine
