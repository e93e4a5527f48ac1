// Metrics of one run (DESIGN §3.6): peak concurrency, forward steps, throughput, TTFT/TPOT percentiles,
// expert bytes moved, hit rates, and an optional per-step timeline. Times are simulated (SimBackend) or
// measured (a measured backend: the forward's wall time plus the engine's own host time, engine.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/sequence.hpp"

namespace amoeba::engine {

struct Percentiles {
  double p10 = 0, p50 = 0, p90 = 0, p99 = 0, mean = 0;
  std::size_t count = 0;  // samples; 0 = undefined (e.g. TPOT when every output is one token), not 0 ms
};
// Linear interpolation between order statistics (numpy's default). Empty input -> count 0 (and zeros).
Percentiles percentiles(std::vector<double> v);

struct TimelineRow {
  std::uint64_t step = 0;
  double time_s = 0, step_ms = 0;
  std::uint32_t running = 0, waiting = 0;
  std::uint64_t batch_tokens = 0;
  std::uint64_t free_kv_pages = 0, free_expert_pages = 0;
  std::uint64_t resident_experts = 0;
  std::uint64_t shortfall_pages = 0;
  std::uint32_t evictions = 0, restores = 0;
  std::uint64_t h2d_bytes = 0;
  // The forward's phases (StepResult): compute per kind, copy engine busy, compute waiting for copies.
  std::uint64_t copy_calls = 0;
  double attention_ms = 0, moe_ms = 0, dense_ms = 0, copy_ms = 0, stall_ms = 0;
  // Measured backends: the engine's own host time in this step (schedule, adjust, commit, complete), on the
  // clock besides step_ms. 0 for a simulated backend, whose clock holds only modelled time.
  double host_ms = 0;
  // The compute stream's busy time in the forward (StepCounters::compute_s; measured: its first to its last
  // event, less the stalls). step_ms - compute_ms - stall_ms is host work the GPU did not hide.
  double compute_ms = 0;
  // The backend's host time in the forward until its final wait (StepCounters::host_s; 0 when simulated).
  double forward_host_ms = 0;
  // The simulator's price of this very forward (EngineOptions::price_with: same batch, change list,
  // residency and routing); < 0 when not priced (no pricing simulator, or a step without a forward).
  double priced_ms = -1;
  // Sequences of the step that add one token (decodes; the rest add prefill chunks).
  std::uint32_t decode_seqs = 0;
  // Tensor parallelism: the step's all-reduces (StepCounters::allreduce_s); 0 on one GPU.
  double allreduce_ms = 0;
};

struct RunResult {
  std::string policy;
  std::uint32_t peak_concurrency = 0;
  std::uint64_t forward_steps = 0;
  std::uint64_t completed_requests = 0, total_requests = 0;
  std::uint64_t output_tokens = 0;
  double makespan_s = 0;
  double throughput_tok_s = 0, throughput_req_s = 0;
  Percentiles ttft_ms, tpot_ms;
  std::uint64_t expert_bytes_h2d = 0;
  double expert_hit_rate = 0;       // routed experts found resident
  double expert_prefetch_rate = 0;  // routed experts restored or predicted in time
  std::uint64_t wasted_prefetches = 0;
  std::uint64_t preemptions = 0;
  std::uint64_t evictions = 0, restores = 0;
  std::uint64_t min_resident_experts = 0, max_resident_experts = 0;
  double copy_stall_s = 0, compute_s = 0;
  double host_s = 0;  // the engine's own host time over the run (measured backends; 0 when simulated)
  // GPU backends: the device's free memory (cudaMemGetInfo) before the backend took any, after its setup,
  // and after the run: equal after-setup and end values mean nothing was allocated in the step loop.
  std::uint64_t device_free_before = 0, device_free_after_setup = 0, device_free_end = 0;
  std::uint64_t pool_bytes = 0, initial_kv_bytes = 0;
  std::uint32_t load_buffer_experts = 0;
  std::vector<TimelineRow> timeline;  // filled when asked for
  // Each request's TTFT in ms, in trace order (NaN where it did not finish); filled with the timeline, so
  // that two runs of one trace compare request by request (compare_runs).
  std::vector<double> request_ttft_ms;
};

// Fills the request-level fields of `r` from the finished sequences.
void summarize_requests(const std::vector<Sequence>& seqs, RunResult& r);

}  // namespace amoeba::engine
