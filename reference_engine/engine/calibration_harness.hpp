// The measuring side of `amoeba calibrate` and `amoeba validate` (docs/engine.md "Calibration"): short runs
// of chosen step shapes through a backend, each measured forward turned into CalibrationSamples priced by
// the simulator's own formulas (calibration.hpp fits them), and the pair of runs a validation compares.
//
// How the shapes are run: through the normal engine (policy_dispatch.hpp run_policy), so the same code
// measures SimBackend on the CPU and CudaBackend on the GPU, with the backend set up once for every shape
// (one process, one engine, one GPU setup). A shape is `requests` requests arriving together with `prompt`
// prompt and `output` output tokens each: its first steps are prefill chunks up to the token budget, then
// every step decodes all of them at contexts prompt .. prompt + output - 1. The shapes' requests arrive
// kShapeGapS apart, so each shape runs alone and the engine's clock jumps over the gaps.
//
// Routing (CalibrationRouting): every MoE layer of a step routes to the same number of distinct experts d,
// a routable count (routable_range, routing.hpp) chosen step by step from the plan's fractions of the
// step's range [min(k, E), min(T k, E)]: the MoE is measured at several token and distinct-expert counts,
// and one step's MoE time covers MoE layers of equal work.
//
// Pricing (forward_samples): per forward, from its StepBatch and StepResult:
//   attention: attention_work(model, l, batch), one sample for all layers (they must do equal work: a
//              hybrid model's layers do not, and give no attention sample), seconds = attention_s;
//   MoE:       moe_work(model, T, d), one sample for all MoE layers when every layer routed to d experts,
//              seconds = moe_s (which excludes the wait for copies on both backends);
//   dense:     lm_head_work(model, sampled sequences), layers 1, seconds = dense_s, for models without
//              dense FFN layers (one measured sum cannot be split between them and the LM head) and steps
//              that sample (a GPU runs no LM head for a step that samples nothing);
//   step:      seconds = step_s, phases_s = attention + MoE + dense + stall seconds (at most step_s);
//   copy:      h2d_bytes, copy_calls, copy_s, where the backend times its copy engine (copy_s > 0: the
//              simulator; the GPU backend reports 0 and its copies are measured by the copy probe below).
// Copies: a CopyTimer measures `calls` host-to-device copies of `bytes_per_call` bytes each, for every
// count in the plan, one expert page per call (a restore's copies) and one whole expert per call (a
// buffered expert's): the simulator's copy_time, or CUDA events around cudaMemcpyAsync from pinned memory
// (h2d_copy_probe.hpp). Each probe is timed copy_repeats times before the engine's run and as often after it,
// the repeats of all probes interleaved, and gives one sample, its fastest time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "amoeba/engine/step.hpp"
#include "engine/calibration.hpp"
#include "engine/metrics.hpp"
#include "engine/model.hpp"
#include "engine/policy_dispatch.hpp"
#include "engine/scenario.hpp"
#include "engine/workload.hpp"

namespace amoeba::engine {

// `requests` requests, each with `prompt` prompt and `output` output tokens, arriving `spacing_s` seconds
// apart (0: together; > 0: each one's prefill meets the decodes of those before it, as in a served trace).
struct CalibrationShape {
  std::uint32_t requests = 1, prompt = 16, output = 8;
  double spacing_s = 0;
  friend bool operator==(const CalibrationShape&, const CalibrationShape&) = default;
};

// Seconds between the arrivals of consecutive shapes: far longer than any shape runs, so shapes never meet.
inline constexpr double kShapeGapS = 1e4;

struct CalibrationPlan {
  std::vector<CalibrationShape> shapes;  // run in this order
  std::uint32_t warmup_shapes = 1;       // the first shapes give no samples (a GPU's first launches)
  // Distinct experts per MoE layer at step i: min + round(f x (max - min)), f = distinct_fractions[i mod n],
  // [min, max] = routable_range(step tokens, k, E).
  // Every other step at the whole range (what a near-uniform router touches; the MoE token-scale table is
  // fitted from those alone), the others at 0, 1/3 and 2/3 of it (skewed routing, for the efficiencies).
  std::vector<double> distinct_fractions{1.0, 0.0, 1.0, 1.0 / 3.0, 1.0, 2.0 / 3.0};
  std::vector<std::uint32_t> copy_calls{1, 2, 4, 8, 16, 32};  // copies per probe
  std::uint32_t copy_repeats = 3;  // each probe measured this often, interleaved; the fastest is the sample
};

// The default plan for a model under `sched` whose pool holds `kv_pages` KV pages (the memory plan's KV):
// a warm-up shape; decode batches of every size 1 .. kEveryDecodeBatchUpTo, of 64 and 256 sequences and of
// max_num_seqs at
// prompts of 32, 256 and 1024 tokens (at most max_model_len - 16), 16 output tokens each; two long prompts
// (one of max_model_len - 16 tokens, two of 3/4 of it) for prefill chunks. A shape is left out when its
// requests x (prompt + output) exceed 65536 tokens (prefill time) or 90% of the KV pages, or its requests
// exceed max_num_seqs. Then a ladder of steps that mix a prefill chunk with decodes: for prompts of
// round(16 x 2^(i/2)) tokens, i = 1, 2, ... while prompt + output fits max_model_len (half octaves from 23),
// kLadderRequests requests of kLadderOutputTokens output tokens each, kLadderSpacingS apart.
// Throws ConfigError naming "memory" when not even one request of 64 tokens fits.
CalibrationPlan default_calibration_plan(const ModelSpec& model, const SchedulerConfig& sched,
                                         std::uint64_t kv_pages, std::uint32_t tokens_per_kv_page = 16);

// Decode batches calibrated one by one: the paged MoE layer changes its tile or path at single batch sizes
// here (on the H200 Qwen1.5's MoE phase took 4.04 ms at 6 sequences and 3.52 at 7:
// docs/results/dense_gemm_h200.md), so the token-scale tables keep a knot per size up to it (calibration.hpp,
// kExactTokenScaleTokens).
inline constexpr std::uint32_t kEveryDecodeBatchUpTo = 16;
inline constexpr std::uint32_t kLadderRequests = 6, kLadderOutputTokens = 32;
inline constexpr double kLadderSpacingS = 0.02;

// The plan's requests: request i of shape g arrives at g x kShapeGapS + i x spacing_s, ids in order from 0.
std::vector<Request> calibration_trace(const CalibrationPlan& plan);

// Every MoE layer of a step routes to d distinct experts (see the header comment): consecutive expert ids
// from an offset that moves by 7 per step and 13 per layer, so that the sets differ from step to step.
class CalibrationRouting final : public RoutingSource {
 public:
  // Throws ConfigError when a count is 0, `fractions` is empty or a fraction is outside [0, 1].
  CalibrationRouting(std::uint32_t layers, std::uint32_t experts, std::uint32_t top_k,
                     std::vector<double> fractions);

  RoutingKind kind() const noexcept override { return RoutingKind::kSynthetic; }
  std::uint32_t layers() const noexcept override { return layers_; }
  std::uint32_t experts() const noexcept override { return experts_; }
  void begin_step(const StepBatch& batch) override;
  std::span<const std::uint32_t> layer_experts(std::uint32_t layer) const override;
  // Distinct experts of every layer at this step.
  std::uint32_t distinct() const noexcept { return distinct_; }

 private:
  std::uint32_t layers_, experts_, top_k_;
  std::vector<double> fractions_;
  std::uint64_t steps_ = 0;
  std::uint32_t distinct_ = 0;
  std::vector<std::uint32_t> sets_;  // [layer * experts ...]: layer l's set at sets_[l * experts_]
};

// The samples of one measured forward, priced as the header comment says (none for a phase it cannot
// price: unequal layers, no sampled sequence, a time of 0).
std::vector<CalibrationSample> forward_samples(const ModelSpec& model, const StepBatch& batch,
                                               const StepResult& result);

// Seconds that `calls` host-to-device copies of `bytes_per_call` bytes each take.
using CopyTimer = std::function<double(std::uint64_t calls, std::uint64_t bytes_per_call)>;

struct CalibrationMeasurement {
  std::vector<CalibrationSample> samples;
  std::uint64_t forward_steps = 0;  // measured forwards, warm-up included
  std::uint64_t warmup_steps = 0;   // of which gave no samples
  std::size_t copy_probes = 0;      // copy probes timed (copy samples x copy_repeats x 2)
  RunResult run;                    // the engine run over every shape
};

// What a calibration run reports as it goes.
struct CalibrationProgress {
  std::function<void(const RunProgress&)> run;  // after every engine step
};

// Runs `plan` through the backend of `setup` (prepare_run of the scenario with calibration_trace(plan) as
// its trace; its routing source is replaced by CalibrationRouting), then the copy probes through `copies`
// (null: none). The samples of warm-up shapes are dropped.
CalibrationMeasurement measure_for_calibration(RunSetup setup, const CalibrationPlan& plan,
                                               const CopyTimer& copies, const CalibrationProgress& progress);

// The copy timer of the simulated GPU of `setup` (SimBackend::copy_time with the setup's cost model).
CopyTimer simulated_copy_timer(const RunSetup& setup);

// ---- `amoeba validate`: one trace through a measured backend and through the simulator, compared step by
// step (compare_runs, calibration.hpp)

struct ValidationLabels {
  std::string model, gpu, policy;
  std::string measured_backend;     // "cuda"; "sim" for a check of the simulator against itself
  bool measured_simulated = false;  // the measured side's times come from a cost model
  std::string measured_cost_model;  // that cost model (measured_simulated only)
  std::string simulated_cost_model;
  std::string workload;                   // one line: requests, rate or trace, seed
  std::string expert_precision = "bf16";  // the experts' precision on both sides (`--expert-precision`)
  // The run's memory and residency (both sides run the same plan): the GPU memory it planned with (the GPU's,
  // or the cap), at most how many experts per layer the policy offloads, how many it starts with resident.
  double gpu_memory_gib = 0;  // 0: not given (the report omits the line)
  std::uint32_t offload_limit = 0, resident_per_layer = 0;
};

// Upper bounds of the |error| buckets the reports count steps in (the last bucket: the rest).
inline constexpr double kErrorBuckets[] = {0.01, 0.02, 0.05, 0.10, 0.20};

// The comparison as text: the step-time error distribution (median, p90, max, signed median, buckets) and
// the end-to-end metrics side by side.
std::string validation_text(const RunComparison& c, const ValidationLabels& labels);
// The same as JSON (`validate --json`).
std::string validation_json(const RunComparison& c, const ValidationLabels& labels);

}  // namespace amoeba::engine
