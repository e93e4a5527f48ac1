// Calibration of the simulator's cost model (sim_backend.hpp) from measured forwards, and the step-by-step
// comparison of a measured and a simulated run of one trace (the core of `amoeba calibrate` / `validate`;
// calibration_harness.hpp takes the measurements, docs/engine.md "Calibration").
//
// A sample is one measured phase of a forward with the quantities the cost model prices it by, computed by
// the simulator's own formulas (attention_work, moe_work, dense_ffn_work, lm_head_work in sim_backend.hpp),
// so the fit and the simulator cannot drift apart.
//
// The fit (fit_cost_model), for the roofline phases (attention, MoE, dense FFN + LM head):
//   predicted = layers x (max(bytes / (HBM bw x mem_eff), FLOPs / (bf16 rate x comp_eff)) + overhead)
//   error     = predicted / measured - 1 (relative: a 50 us layer weighs as much as a 5 ms one)
// minimising the sum of squared relative errors. The per-layer overhead is one number shared by the three
// phases (CostModelParams has one): a golden-section search over it in [0, the smallest measured time per
// layer], and for each candidate, per phase, a grid search of (mem_eff, comp_eff): a coarse grid of 0.01 over
// [0.01, 1] (the range a cost-model file accepts), then a grid of 0.0005 within ±0.01 of the coarse best.
// Then the overhead is polished in closed form (least squares in relative error for fixed efficiencies) and
// the efficiencies searched once more. An efficiency the samples cannot see (a phase whose samples are all
// memory-bound leaves its compute efficiency free above some value) is kept at `start`'s value when that
// fits as well, else set to the grid point nearest it that does.
//   step_overhead_s = median over whole-step samples of (step time - the step's measured phases), >= 0;
//   h2d_copy_latency_scale = u and h2d_bandwidth_scale = 1 / x, (u, x) the closed-form least-squares
//     (relative error) solution of seconds = calls x profile copy latency x u + bytes / profile H2D bandwidth
//     x x, u clamped to [0, 100] and 1 / x to [0.01, 2]; copies of a single size cannot separate the two
//     (u is then kept and x alone fitted).
// Then the token-scale tables (CostModelParams): for each MoE sample at the routable maximum of distinct
// experts (a near-uniform router's; skewed routing stays with the roofline, whose bytes follow the distinct
// experts, since one table keyed by tokens cannot hold both: on the H200 the decode tiles with 4 experts for
// 200 tokens run ~3x their roofline, with 60 ~1.2x) r = (seconds / layers - overhead) / max(...) at the
// fitted efficiencies, clamped to [kMinTokenScale, kMaxTokenScale]; samples of at most kExactTokenScaleTokens
// tokens grouped by their token count (a kernel may change tile or path at one batch size), larger ones by
// round(2 log2(tokens)) (half octaves); a group of >= kMinTokenScaleSamples samples gives a knot at its
// median tokens with its median r (a group with fewer gives none: the neighbours' line covers it). The same
// for attention over the samples with prefill tokens (decode steps stay at 1). A table with no knot is empty.
// The efficiencies are searched without the tables (the roofline first, the tables on what it leaves).
// A phase without samples keeps `start`'s parameters. The result carries the residuals per phase.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/gpu.hpp"
#include "engine/metrics.hpp"
#include "engine/model.hpp"

namespace amoeba::engine {

enum class CalibrationPhase : std::uint8_t {
  kAttention,  // attention (full or linear) of `layers` layers of equal work
  kMoe,        // the MoE of `layers` layers (routed + shared experts, router)
  kDense,      // dense FFN layers, or the LM head (layers = 1)
  kStep,       // a whole forward: seconds = step time, phases_s = its measured phases
  kCopy,       // host-to-device copies: bytes, copy_calls, seconds
};
std::string_view to_string(CalibrationPhase p) noexcept;

struct CalibrationSample {
  CalibrationPhase phase = CalibrationPhase::kAttention;
  // Roofline phases: bytes and FLOPs of ONE layer (RooflineWork from sim_backend.hpp). kCopy: bytes copied.
  double bytes = 0, flops = 0;
  std::uint32_t layers = 1;      // roofline phases: how many layers of this work `seconds` covers (>= 1)
  std::uint64_t copy_calls = 0;  // kCopy: copy calls (>= 1)
  // kStep: the step's measured attention + MoE + dense + stall seconds (what is not step overhead).
  double phases_s = 0;
  double seconds = 0;  // measured, > 0
  // The key of the phase's token-scale table (CostModelParams): kMoe the step's tokens, kAttention its
  // prefill tokens (0 in a decode step); 0 elsewhere.
  double tokens = 0;
  // kMoe: the distinct experts each layer routed to (0: not known). The MoE table is fitted from the samples
  // at the routable maximum min(tokens x top_k, experts) only (or of unknown count).
  double distinct = 0;
};

// Throws ConfigError naming "samples[i].field", its value and the rule for the first bad sample: seconds
// not finite or <= 0; bytes or FLOPs negative or not finite; a roofline phase with zero bytes and zero
// FLOPs or layers 0; a copy with zero bytes or zero calls; a step whose phases_s is negative, not finite or
// exceeds seconds.
void check_samples(const std::vector<CalibrationSample>& samples);

// The fitted parameters (calibrated = true, `source` describing the fit, residuals filled); `start` gives
// the name, the scales of the precisions not measured, and every parameter whose phase has no samples.
// Quantized experts (model.expert_precision int8 or int4): the MoE samples are of the quantized kernel, so
// what their fit finds is that precision's efficiency; the file keeps start's bf16 MoE efficiencies and
// MoE token-scale table, and stores the ratio as int8_ / int4_moe_{memory,compute}_scale (what the simulator
// multiplies them by; fitted with start's table applied) and what those leave per token count as the
// precision's own table (int8_ / int4_moe_token_scale, on top of start's), fitted at start's per-layer
// overhead; every other parameter (attention, dense, the overheads, the copy fit) stays start's, so a bf16
// profile (e.g. h200-qwen1.5 as --cost-model) gains the quantized kernel's costs and keeps its own.
// Refuses (ConfigError) bad samples and GPU profiles of several GPUs (not measured by the GPU backend yet).
CostModelParams fit_cost_model(const std::vector<CalibrationSample>& samples, const ModelSpec& model,
                               const GpuProfile& gpu, const CostModelParams& start);

// What `params` predicts for one sample (the formulas above; kStep: params.step_overhead_s + phases_s); the
// MoE of a quantized `precision` at params' efficiencies times that precision's scales.
double predicted_seconds(const CalibrationSample& s, const GpuProfile& gpu, const CostModelParams& params,
                         ExpertPrecision precision = ExpertPrecision::kBf16);

inline constexpr std::size_t kMinTokenScaleSamples = 2;
inline constexpr double kExactTokenScaleTokens = 16;

// Median, p90 and count of |predicted / measured - 1| per phase that has samples, in CalibrationPhase order.
std::vector<CostModelResidual> cost_model_residuals(const std::vector<CalibrationSample>& samples,
                                                    const GpuProfile& gpu, const CostModelParams& params,
                                                    ExpertPrecision precision = ExpertPrecision::kBf16);

// ---- step-by-step comparison of a measured and a simulated run of one trace

// How forward steps (timeline rows with batch_tokens > 0) were paired:
//   kByIndex: both runs have the same forward steps with the same (batch_tokens, running) at each index
//     (the schedules agree: every arrival fell into the same step), pair i with i;
//   kAligned: the schedules diverged (the measured clock moved an arrival into another step): pair steps of
//     equal (batch_tokens, running) in order, greedily: at a mismatch, skip to the nearest pair (i', j') with
//     equal keys, i' - i + j' - j smallest (ties: smaller i'), within kAlignWindow steps of each run; rows
//     skipped are unmatched. A pair is two batches of the same shape, not necessarily the same sequences;
//   kNone: no pair found: only the end-to-end metrics compare.
enum class StepMatch : std::uint8_t { kByIndex, kAligned, kNone };
std::string_view to_string(StepMatch m) noexcept;
inline constexpr std::size_t kAlignWindow = 64;

struct EndToEnd {
  double throughput_tok_s = 0, ttft_p50_ms = 0, tpot_p50_ms = 0, makespan_s = 0;
  std::uint64_t forward_steps = 0;
  // What the experts' movement cost: bytes over PCIe, evictions, restores, the compute stream's wait for
  // copies; and the scheduler's preemptions (where two runs' copy-bound steps part ways, these say why).
  std::uint64_t expert_bytes_h2d = 0, evictions = 0, restores = 0, preemptions = 0;
  double copy_stall_s = 0;
};

struct RunComparison {
  StepMatch match = StepMatch::kNone;
  std::size_t measured_steps = 0, simulated_steps = 0;  // forward steps (batch_tokens > 0)
  std::size_t matched = 0;
  // |simulated step_ms / measured step_ms - 1| over matched steps (count 0 when none matched), and the signed
  // median (simulated slower > 0).
  double median_abs_rel_error = 0, p90_abs_rel_error = 0, max_abs_rel_error = 0, median_rel_error = 0;
  std::vector<double> errors;  // simulated step_ms / measured step_ms - 1 of each matched pair, in order
  // Each measured forward step against the simulator's price of that very step (TimelineRow::priced_ms: the
  // same batch, change list, residency and routing; RunOptions::price_with): the cost model's own error,
  // apart from the two schedules' divergence. priced = 0 when the measured run was not priced.
  struct Priced {
    std::size_t steps = 0;
    double median_abs_rel_error = 0, p90_abs_rel_error = 0, max_abs_rel_error = 0, median_rel_error = 0;
    std::vector<double> errors;  // priced_ms / step_ms - 1 of each priced forward step, in order
    // The same by kind of step (TimelineRow::decode_seqs): "decode" (every sequence adds one token), "mixed"
    // (decodes beside prefill chunks), "prefill" (prefill chunks only); kinds without priced steps left out.
    struct Kind {
      std::string kind;
      std::size_t steps = 0;
      double median_abs_rel_error = 0, p90_abs_rel_error = 0, median_rel_error = 0;
    };
    std::vector<Kind> by_kind;
  } priced;
  EndToEnd measured, simulated;
  // TTFT request by request: simulated / measured of each request that finished in both runs with a
  // measured TTFT > 0 (both runs serve one trace; RunResult::request_ttft_ms). A bias here is the schedule's
  // (arrivals landing in other steps), since the priced steps above measure the step prices.
  struct PairedTtft {
    std::size_t requests = 0;
    double median_ratio = 0, p10_ratio = 0, p90_ratio = 0;
  } ttft_paired;
};

// The matched step-time errors and the end-to-end metrics side by side. step_ms is the forward alone on
// both sides (the measured engine's own host time, host_ms, is not priced by the simulator). Refuses
// (ConfigError naming "measured.timeline[i].step_ms" or "simulated...") a step time that is not finite or
// negative, a measured forward step of 0 ms, and a priced_ms that is not finite.
RunComparison compare_runs(const RunResult& measured, const RunResult& simulated);

}  // namespace amoeba::engine
