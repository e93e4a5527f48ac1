// SimBackend: a model of the `backend` concept (amoeba/engine/backend.hpp) that runs no GPU. It prices one
// forward with a documented cost model (DESIGN §3.6); every number it produces is simulated.
//
// What is copied is not decided here: the forward runs the LoadPlanner (amoeba/loader/load_planner.hpp), the
// same per-layer plan the CUDA loader executes (restores into reserved pages, then predicted experts into the
// load buffer, then on-demand misses), and prices its copies. Only the predictor is modelled (routing.hpp:
// a cross-layer gate of a given accuracy, none, or an oracle), since the simulator has no hidden states.
//
// Compute (one stream), per layer, a roofline with efficiency factors (CostModelParams):
//   time = max(bytes / (HBM bandwidth x memory efficiency), FLOPs / (bf16 rate x compute efficiency))
//          + per_layer_overhead
//   attention: bytes = attention weights + KV read (each scheduled sequence's context after the step);
//              FLOPs = 2 T x attention params + sum over sequences of 4 x new x (context before + new / 2) x
//              heads x head_dim (scores and values);
//   linear attention (hybrid): bytes = weights + 2 x state bytes per sequence (read and write);
//              FLOPs = 2 T x params + 4 T x value_heads x dk x dv;
//   MoE: bytes = distinct experts touched x their transfer bytes (3 payloads: bf16, or int8/int4 weights and
//        scales) + shared experts + router; FLOPs = 2 T x top_k x 3 x F x H + shared experts' 2 T x 3 x Fs x
//        H; on quantized experts the efficiencies are scaled by the cost model's int8/int4 factors; with
//        MoeKernel::kGather each layer first copies its routed experts into a contiguous workspace:
//        + 2 x routed experts x transfer bytes / (HBM bandwidth x dense memory efficiency) +
//        per_layer_overhead;
//   dense FFN layers and the LM head (sampled sequences only) as dense GEMMs; plus step_overhead per step.
//   A calibrated cost model may carry token-scale tables (CostModelParams): the MoE's max(...) term times
//   moe_token_scale at the step's tokens, the attention's times attention_prefill_scale at the step's prefill
//   tokens (prefill_tokens; steps without prefill unscaled): what one roofline cannot say about a kernel at a
//   given size.
// Tensor parallelism over N GPUs (GpuProfile::gpus > 1): the model is one GPU's shard (model.hpp,
//   shard_model), so every size above is per GPU; each layer adds two all-reduces of T x hidden x 2 B on the
//   compute stream (after attention, after the MoE or dense FFN), each latency + 2 (N-1)/N x bytes / busbw
//   (GpuProfile::allreduce_time), counted in compute_s. On one GPU nothing is added.
// Copies (one copy engine per GPU, FIFO, pinned host memory): each copy call pays the profile's per-copy
//   latency x h2d_copy_latency_scale and its bytes move at the H2D bandwidth x h2d_bandwidth_scale; each GPU
//   moves its own shard of
//   an expert over its own link, all at once, so one GPU's copies set the time. The planner's calls: a
//   restore is 3 calls (one per reserved page), a buffered expert 1 (its matrices are contiguous in the host
//   store and in the slot).
// Timeline of MoE layer m: its prefetch queue (restores, then predicted experts) is issued when layer m-1's
//   attention ends (the first at the start of the step), behind whatever the copy engine still has queued;
//   layer m's attention runs without waiting; after it, the router's misses are queued; layer m's MoE waits
//   until every copy of m has completed (the stall). Only the MoE waits: the attention of a layer reads no
//   expert, and the CUDA loader makes only the MoE kernel wait for the layer's copies.
//   Evicted experts stay usable until the forward ends (deferred eviction, DESIGN §3.3): they cost nothing.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "amoeba/adjust/change_list.hpp"
#include "amoeba/engine/backend.hpp"
#include "amoeba/engine/step.hpp"
#include "amoeba/expert/residency_table.hpp"
#include "amoeba/loader/load_planner.hpp"
#include "engine/gpu.hpp"
#include "engine/model.hpp"
#include "engine/random.hpp"
#include "engine/routing.hpp"

namespace amoeba::engine {

// What the roofline prices: the bytes a layer moves through HBM and its FLOPs (the table above). The
// simulator and the calibration (calibration.hpp) both take them from these functions.
struct RooflineWork {
  double bytes = 0, flops = 0;
};
// Attention (full or linear) of `layer` for `batch` (sizes of one GPU's shard under tensor parallelism).
RooflineWork attention_work(const ModelSpec& model, std::uint32_t layer, const StepBatch& batch);
// One MoE layer of `tokens` tokens touching `distinct_experts` routed experts (shared experts and router
// included).
RooflineWork moe_work(const ModelSpec& model, std::uint64_t tokens, std::uint64_t distinct_experts);
// One dense FFN layer of `tokens` tokens.
RooflineWork dense_ffn_work(const ModelSpec& model, std::uint64_t tokens);
// The LM head for `sampling_seqs` sampled sequences.
RooflineWork lm_head_work(const ModelSpec& model, std::uint64_t sampling_seqs);
// Tokens of the sequences that add more than one token in `batch` (prefill chunks); 0 in a decode step.
std::uint64_t prefill_tokens(const StepBatch& batch) noexcept;
// max(bytes / (HBM bandwidth x mem_eff), FLOPs / (bf16 rate x comp_eff)) x scale + overhead.
double roofline_time(RooflineWork w, const GpuProfile& gpu, double mem_eff, double comp_eff, double overhead,
                     double scale = 1.0) noexcept;
// `calls` host-to-device copies of `bytes` in all: calls x latency x h2d_copy_latency_scale + bytes /
// (H2D bandwidth x h2d_bandwidth_scale).
double copy_time(const GpuProfile& gpu, const CostModelParams& cost, double calls, double bytes) noexcept;
// The factors of the MoE efficiencies for experts in `p`: cost.int8 / cost.int4, {1, 1} (no table) for bf16.
const CostModelParams::PrecisionScale& moe_precision_scale(const CostModelParams& cost,
                                                           ExpertPrecision p) noexcept;
// The MoE's token-scale factor at `tokens` for experts in `p`: moe_token_scale there, times the precision's
// own table for int8 / int4.
double moe_token_factor(const CostModelParams& cost, ExpertPrecision p, double tokens) noexcept;

class SimBackend {
 public:
  // One planned copy as the simulator priced it: MoE layer, whether it was queued after routing (a miss or a
  // late restore) rather than in the layer's prefetch queue, and the planner's ExpertCopy.
  struct CopyRecord {
    std::uint32_t layer = 0;
    bool after_routing = false;
    ExpertCopy copy;
    friend bool operator==(const CopyRecord&, const CopyRecord&) = default;
  };

  // load_buffer_experts: slots per load buffer (= expert_offload_limit; 0 when nothing may be offloaded).
  SimBackend(const ModelSpec& model, const GpuProfile& gpu, const CostModelParams& cost,
             const PredictorParams& predictor, std::uint32_t load_buffer_experts, std::uint64_t seed,
             MoeKernel kernel = MoeKernel::kPaged);

  static constexpr std::string_view name() noexcept { return "sim"; }

  // One forward of in.batch (the backend concept). The routing source must know its choices (synthetic or
  // recorded); a kModel source is refused with ConfigError. Throws std::logic_error if the plan breaks the
  // offload limit (more misses than load-buffer slots: the adjuster's invariant is broken).
  template <class Pool>
  std::optional<ChangeError> forward(const StepInput<Pool>& in, StepResult& out) {
    if (auto e = planner_.begin_forward(in.changes, in.residency, in.pool)) return e;
    simulate(in.batch, in.residency, in.routing, out);
    (void)planner_.end_forward();
    return std::nullopt;
  }

  // Pure compute time of one layer kind, exposed for tests and docs.
  double attention_time(std::uint32_t layer, const StepBatch& batch) const;
  double moe_time(std::uint64_t tokens, std::uint64_t distinct_experts) const;
  // One tensor-parallel all-reduce of the hidden states of `tokens` tokens (0 on one GPU).
  double allreduce_time(std::uint64_t tokens) const noexcept;
  // MoeKernel::kGather: copying `experts` routed experts into a contiguous workspace (0 for kPaged).
  double gather_time(std::uint64_t experts) const noexcept;
  // Copy-engine time of `calls` copy calls moving `bytes`.
  double copy_time(std::uint64_t calls, std::uint64_t bytes) const;
  double idle_step_s() const noexcept { return cost_.step_overhead_s; }
  const LoadPlanner& planner() const noexcept { return planner_; }
  // Every copy of the last forward, in the order the copy engine ran them.
  const std::vector<CopyRecord>& last_copies() const noexcept { return copies_; }

 private:
  void simulate(const StepBatch& batch, const ResidencyTable& residency, RoutingSource& routing,
                StepResult& out);
  double roofline(RooflineWork w, double mem_eff, double comp_eff, double scale = 1.0) const noexcept;
  // attention_time with the step's prefill token-scale factor already looked up (once per step).
  double attention_time(std::uint32_t layer, const StepBatch& batch, double prefill_scale) const;

  ModelSpec model_;
  GpuProfile gpu_;
  CostModelParams cost_;
  PredictorParams predictor_;
  MoeKernel kernel_;
  double moe_memory_efficiency_, moe_compute_efficiency_;  // the cost model's, scaled for the precision
  LoadPlanner planner_;
  Rng rng_;
  // Scratch reused across forwards.
  std::vector<std::uint8_t> touched_, resident_, predicted_flags_, routed_flags_;
  std::vector<std::uint32_t> predicted_, buffered_;
  std::vector<CopyRecord> copies_;
};

}  // namespace amoeba::engine
