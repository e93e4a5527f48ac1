// The calibration harness; see calibration_harness.hpp.
#include "engine/calibration_harness.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "amoeba/core/errors.hpp"
#include "engine/routing.hpp"
#include "engine/sim_backend.hpp"

namespace amoeba::engine {

namespace {

constexpr std::uint32_t kOutputTokens = 16;
constexpr std::uint64_t kMaxShapeTokens = 65536;  // requests x (prompt + output): bounds a shape's prefill
constexpr double kKvShare = 0.9;                  // of the KV pages a shape may fill (no preemption)

std::uint64_t kv_pages_of(const ModelSpec& model, const CalibrationShape& s, std::uint32_t tokens_per_page) {
  const std::uint64_t blocks = (std::uint64_t(s.prompt) + s.output + tokens_per_page - 1) / tokens_per_page;
  return std::uint64_t(s.requests) * blocks * model.attention_layers();
}

}  // namespace

CalibrationPlan default_calibration_plan(const ModelSpec& model, const SchedulerConfig& sched,
                                         std::uint64_t kv_pages, std::uint32_t tokens_per_kv_page) {
  const std::uint32_t seqs = sched.max_num_seqs;
  const std::uint32_t longest = sched.max_model_len > kOutputTokens ? sched.max_model_len - kOutputTokens : 1;
  const double usable = kKvShare * double(kv_pages);
  auto fits = [&](const CalibrationShape& s) {
    return s.requests >= 1 && s.requests <= seqs && s.prompt >= 1 &&
           std::uint64_t(s.requests) * (std::uint64_t(s.prompt) + s.output) <= kMaxShapeTokens &&
           double(kv_pages_of(model, s, tokens_per_kv_page)) <= usable;
  };
  CalibrationPlan plan;
  const CalibrationShape warmup{std::min<std::uint32_t>(4, seqs), std::min<std::uint32_t>(64, longest), 4};
  const CalibrationShape single{1, std::min<std::uint32_t>(64, longest), 4};
  if (fits(warmup))
    plan.shapes.push_back(warmup);
  else if (fits(single))
    plan.shapes.push_back(single);
  else
    throw ConfigError("memory", std::to_string(kv_pages) + " KV pages",
                      "calibration needs room for at least one request of " + std::to_string(single.prompt) +
                          " + " + std::to_string(single.output) +
                          " tokens in the pool's KV: raise --gpu-memory-gib or choose a smaller model");
  std::vector<std::uint32_t> batches{64, 256};
  for (std::uint32_t b = 1; b <= kEveryDecodeBatchUpTo; ++b) batches.push_back(b);
  if (std::find(batches.begin(), batches.end(), seqs) == batches.end()) batches.push_back(seqs);
  std::sort(batches.begin(), batches.end());
  std::vector<std::uint32_t> prompts;
  for (std::uint32_t p : {32u, 256u, 1024u})
    if (std::find(prompts.begin(), prompts.end(), std::min(p, longest)) == prompts.end())
      prompts.push_back(std::min(p, longest));
  for (std::uint32_t b : batches)
    for (std::uint32_t p : prompts)
      if (const CalibrationShape s{b, p, kOutputTokens}; fits(s)) plan.shapes.push_back(s);
  // Long prompts: the longest prefill one request can have, and two that the token budget chunks.
  for (const CalibrationShape s :
       {CalibrationShape{1, longest, kOutputTokens},
        CalibrationShape{2, std::max<std::uint32_t>(1, longest / 4 * 3), kOutputTokens}})
    if (fits(s) && std::find(plan.shapes.begin() + 1, plan.shapes.end(), s) == plan.shapes.end())
      plan.shapes.push_back(s);
  // The ladder of mixed steps.
  for (int i = 1;; ++i) {
    const auto prompt = static_cast<std::uint32_t>(std::lround(16.0 * std::exp2(0.5 * i)));
    if (std::uint64_t(prompt) + kLadderOutputTokens > sched.max_model_len) break;
    if (const CalibrationShape s{kLadderRequests, prompt, kLadderOutputTokens, kLadderSpacingS}; fits(s))
      plan.shapes.push_back(s);
  }
  return plan;
}

std::vector<Request> calibration_trace(const CalibrationPlan& plan) {
  std::vector<Request> out;
  for (std::size_t g = 0; g < plan.shapes.size(); ++g)
    for (std::uint32_t i = 0; i < plan.shapes[g].requests; ++i)
      out.push_back(Request{out.size(), double(g) * kShapeGapS + double(i) * plan.shapes[g].spacing_s,
                            plan.shapes[g].prompt, plan.shapes[g].output});
  return out;
}

CalibrationRouting::CalibrationRouting(std::uint32_t layers, std::uint32_t experts, std::uint32_t top_k,
                                       std::vector<double> fractions)
    : layers_(layers), experts_(experts), top_k_(top_k), fractions_(std::move(fractions)) {
  if (layers == 0) throw_config_error("routing.layers", 0, "must be at least 1 (MoE layers of the model)");
  if (experts == 0) throw_config_error("routing.experts", 0, "must be at least 1 (routed experts per layer)");
  if (top_k == 0) throw_config_error("routing.top_k", 0, "must be at least 1 (experts per token)");
  if (fractions_.empty())
    throw ConfigError("calibration.distinct_fractions", "[]", "must hold at least one fraction");
  for (std::size_t i = 0; i < fractions_.size(); ++i)
    if (!(fractions_[i] >= 0.0 && fractions_[i] <= 1.0))
      throw ConfigError("calibration.distinct_fractions[" + std::to_string(i) + "]",
                        std::to_string(fractions_[i]), "must be in [0, 1]");
}

void CalibrationRouting::begin_step(const StepBatch& batch) {
  const RoutableRange r = routable_range(batch.tokens, top_k_, experts_);
  const double f = fractions_[steps_ % fractions_.size()];
  distinct_ = static_cast<std::uint32_t>(r.min + std::llround(f * double(r.max - r.min)));
  sets_.resize(std::size_t(layers_) * distinct_);
  for (std::uint32_t l = 0; l < layers_; ++l) {
    const std::uint64_t offset = (steps_ * 7 + std::uint64_t(l) * 13) % experts_;
    std::uint32_t* set = sets_.data() + std::size_t(l) * distinct_;
    for (std::uint32_t i = 0; i < distinct_; ++i)
      set[i] = static_cast<std::uint32_t>((offset + i) % experts_);
    std::sort(set, set + distinct_);
  }
  ++steps_;
}

std::span<const std::uint32_t> CalibrationRouting::layer_experts(std::uint32_t layer) const {
  return std::span<const std::uint32_t>(sets_).subspan(std::size_t(layer) * distinct_, distinct_);
}

std::vector<CalibrationSample> forward_samples(const ModelSpec& model, const StepBatch& batch,
                                               const StepResult& r) {
  std::vector<CalibrationSample> out;
  auto positive = [](double s) { return std::isfinite(s) && s > 0; };
  // Attention: one sample when every layer does the same work.
  const RooflineWork a = attention_work(model, 0, batch);
  bool equal = true;
  for (std::uint32_t l = 1; l < model.num_layers && equal; ++l) {
    const RooflineWork w = attention_work(model, l, batch);
    equal = w.bytes == a.bytes && w.flops == a.flops;
  }
  if (equal && positive(r.attention_s))
    out.push_back({CalibrationPhase::kAttention, a.bytes, a.flops, model.num_layers, 0, 0, r.attention_s,
                   double(prefill_tokens(batch))});
  // MoE: one sample when every MoE layer routed to the same number of experts.
  const std::uint32_t moe_layers = r.routed_layers();
  if (moe_layers > 0 && moe_layers == model.moe_layers() && positive(r.moe_s)) {
    const std::size_t d = r.routed_at(0).size();
    bool same = true;
    for (std::uint32_t m = 1; m < moe_layers && same; ++m) same = r.routed_at(m).size() == d;
    if (same) {
      const RooflineWork w = moe_work(model, batch.tokens, d);
      out.push_back({CalibrationPhase::kMoe, w.bytes, w.flops, moe_layers, 0, 0, r.moe_s,
                     double(batch.tokens), double(d)});
    }
  }
  // Dense: the LM head alone (no dense FFN layer shares the measured sum), in steps that sample.
  if (model.first_dense_layers == 0 && batch.sampling_seqs > 0 && positive(r.dense_s)) {
    const RooflineWork w = lm_head_work(model, batch.sampling_seqs);
    out.push_back({CalibrationPhase::kDense, w.bytes, w.flops, 1, 0, 0, r.dense_s});
  }
  // The whole step: what is not in a measured phase is step overhead.
  if (positive(r.step_s)) {
    const double phases = r.attention_s + r.moe_s + r.dense_s + r.stall_s;
    out.push_back({CalibrationPhase::kStep, 0, 0, 1, 0, std::clamp(phases, 0.0, r.step_s), r.step_s});
  }
  // Copies, where the backend timed its copy engine.
  if (positive(r.copy_s) && r.copy_calls > 0 && r.h2d_bytes > 0)
    out.push_back({CalibrationPhase::kCopy, double(r.h2d_bytes), 0, 1, r.copy_calls, 0, r.copy_s});
  return out;
}

CalibrationMeasurement measure_for_calibration(RunSetup setup, const CalibrationPlan& plan,
                                               const CopyTimer& copies, const CalibrationProgress& progress) {
  CalibrationMeasurement m;
  std::uint64_t warmup_requests = 0;
  for (std::size_t g = 0; g < plan.warmup_shapes && g < plan.shapes.size(); ++g)
    warmup_requests += plan.shapes[g].requests;
  const ModelSpec model = setup.model;
  const std::vector<double> fractions = plan.distinct_fractions;
  setup.options.make_routing = [model, fractions]() -> std::unique_ptr<RoutingSource> {
    return std::make_unique<CalibrationRouting>(model.moe_layers(), model.num_experts, model.top_k,
                                                fractions);
  };
  setup.options.observe_forward = [&](const StepBatch& batch, const StepResult& result) {
    ++m.forward_steps;
    // Requests are numbered in shape order (calibration_trace) and shapes never share a step.
    if (!batch.seqs.empty() && batch.seqs.front().request < warmup_requests) {
      ++m.warmup_steps;
      return;
    }
    const std::vector<CalibrationSample> s = forward_samples(model, batch, result);
    m.samples.insert(m.samples.end(), s.begin(), s.end());
  };
  setup.options.progress = progress.run;
  // Each copy probe is measured copy_repeats times before the engine's run and as often after it, the
  // repeats of all probes interleaved, and the fastest time kept: whatever else slows the link only adds
  // (measured on the H200: stretches of ~30 GB/s instead of 54 over consecutive probes, in runs after an
  // uncapped engine had freed its pinned store), and interleaving keeps one stretch from taking every repeat.
  std::vector<CalibrationSample> probes;
  if (copies && plan.copy_repeats > 0) {
    const std::uint64_t expert = model.expert_transfer_bytes();
    for (std::uint32_t calls : plan.copy_calls)
      for (const std::uint64_t per_call : {expert / 3, expert}) {  // one expert page, one whole expert
        CalibrationSample s{CalibrationPhase::kCopy, double(calls) * double(per_call), 0, 1, calls};
        s.seconds = std::numeric_limits<double>::infinity();
        probes.push_back(s);
      }
  }
  auto probe_pass = [&] {
    for (std::uint32_t rep = 0; rep < plan.copy_repeats; ++rep)
      for (CalibrationSample& s : probes) {
        const std::uint64_t calls = s.copy_calls, per_call = std::uint64_t(s.bytes) / calls;
        s.seconds = std::min(s.seconds, copies(calls, per_call));
        ++m.copy_probes;
      }
  };
  probe_pass();
  m.run = run_policy(setup);
  probe_pass();
  m.samples.insert(m.samples.end(), probes.begin(), probes.end());
  return m;
}

CopyTimer simulated_copy_timer(const RunSetup& setup) {
  auto backend = std::make_shared<SimBackend>(make_simulator(setup, setup.cost));
  return [backend](std::uint64_t calls, std::uint64_t bytes_per_call) {
    return backend->copy_time(calls, calls * bytes_per_call);
  };
}

namespace {

std::vector<std::size_t> bucket_counts(const std::vector<double>& errors) {
  std::vector<std::size_t> n(std::size(kErrorBuckets) + 1, 0);
  for (double e : errors) {
    std::size_t b = 0;
    while (b < std::size(kErrorBuckets) && std::abs(e) >= kErrorBuckets[b]) ++b;
    ++n[b];
  }
  return n;
}

std::string percent(double x) {
  return fmt::format("{:.2f}%", 100.0 * x);
}

}  // namespace

namespace {

// Two lines: |error| median, p90, max and the signed median; the steps counted by |error| bucket.
std::string error_lines(double median_abs, double p90_abs, double max_abs, double median_signed,
                        const std::vector<double>& errors) {
  std::string t = fmt::format("  |error| median {}, p90 {}, max {}; signed median {}{}\n",
                              percent(median_abs), percent(p90_abs), percent(max_abs), percent(median_signed),
                              median_signed >= 5e-4    ? " (the simulator is slower)"
                              : median_signed <= -5e-4 ? " (the simulator is faster)"
                                                       : "");
  const std::vector<std::size_t> n = bucket_counts(errors);
  t += "  steps by |error|:";
  double lo = 0;
  for (std::size_t b = 0; b < n.size(); ++b) {
    const std::string range = b < std::size(kErrorBuckets)
                                  ? fmt::format("{:g}-{:g}%", 100 * lo, 100 * kErrorBuckets[b])
                                  : fmt::format(">= {:g}%", 100 * lo);
    t += fmt::format(" {} {} ({:.0f}%){}", range, n[b], 100.0 * double(n[b]) / double(errors.size()),
                     b + 1 < n.size() ? "," : "\n");
    if (b < std::size(kErrorBuckets)) lo = kErrorBuckets[b];
  }
  return t;
}

nlohmann::ordered_json error_buckets_json(const std::vector<double>& errors) {
  nlohmann::ordered_json buckets = nlohmann::ordered_json::array();
  const std::vector<std::size_t> n = bucket_counts(errors);
  for (std::size_t b = 0; b < n.size(); ++b) {
    nlohmann::ordered_json e;
    if (b < std::size(kErrorBuckets))
      e["below"] = kErrorBuckets[b];
    else
      e["below"] = nullptr;
    e["steps"] = n[b];
    buckets.push_back(e);
  }
  return buckets;
}

}  // namespace

std::string validation_text(const RunComparison& c, const ValidationLabels& l) {
  std::string t;
  t += fmt::format("validate: {} (backend {}{}) against the SIMULATED GPU with cost model {}\n",
                   l.measured_simulated ? "SIMULATED GPU" : "MEASURED on a GPU", l.measured_backend,
                   l.measured_simulated ? ", cost model " + l.measured_cost_model : std::string(),
                   l.simulated_cost_model);
  t += fmt::format("model {} on {}, {} experts, policy {}, {}\n", l.model, l.gpu, l.expert_precision,
                   l.policy, l.workload);
  if (l.gpu_memory_gib > 0)
    t += fmt::format(
        "GPU memory {:.2f} GiB, at most {} experts per layer offloaded, {} resident at the start\n",
        l.gpu_memory_gib, l.offload_limit, l.resident_per_layer);
  t += "\n";
  if (c.match == StepMatch::kNone) {
    t += fmt::format(
        "step time: no forward steps could be paired (measured {}, simulated {}): only the end-to-end "
        "metrics compare\n",
        c.measured_steps, c.simulated_steps);
  } else {
    t += fmt::format(
        "step time, simulated / measured - 1, over {} paired forward steps ({}; forward steps: measured {}, "
        "simulated {}):\n",
        c.matched, to_string(c.match), c.measured_steps, c.simulated_steps);
    t += error_lines(c.median_abs_rel_error, c.p90_abs_rel_error, c.max_abs_rel_error, c.median_rel_error,
                     c.errors);
  }
  if (c.priced.steps > 0) {
    t += fmt::format(
        "step time, the simulator pricing each measured step itself (same batch, change list, residency, "
        "routing) / measured - 1, over {} forward steps:\n",
        c.priced.steps);
    t += error_lines(c.priced.median_abs_rel_error, c.priced.p90_abs_rel_error, c.priced.max_abs_rel_error,
                     c.priced.median_rel_error, c.priced.errors);
    for (const auto& k : c.priced.by_kind)
      t += fmt::format("  {:<8} {:>6} steps: |error| median {}, p90 {}; signed median {}\n", k.kind, k.steps,
                       percent(k.median_abs_rel_error), percent(k.p90_abs_rel_error),
                       percent(k.median_rel_error));
  }
  t += fmt::format("\n{:<18} {:>12} {:>12} {:>12}\n", "end to end", "measured", "simulated", "sim/measured");
  auto row = [&](const char* name, double m, double s, int decimals) {
    const std::string ratio = m != 0 ? fmt::format("{:.3f}", s / m) : std::string("-");
    t += fmt::format("{:<18} {:>12.{}f} {:>12.{}f} {:>12}\n", name, m, decimals, s, decimals, ratio);
  };
  row("throughput tok/s", c.measured.throughput_tok_s, c.simulated.throughput_tok_s, 1);
  row("TTFT p50 ms", c.measured.ttft_p50_ms, c.simulated.ttft_p50_ms, 1);
  row("TPOT p50 ms", c.measured.tpot_p50_ms, c.simulated.tpot_p50_ms, 2);
  row("makespan s", c.measured.makespan_s, c.simulated.makespan_s, 2);
  row("forward steps", double(c.measured.forward_steps), double(c.simulated.forward_steps), 0);
  row("expert GB over PCIe", double(c.measured.expert_bytes_h2d) / 1e9,
      double(c.simulated.expert_bytes_h2d) / 1e9, 2);
  row("evictions", double(c.measured.evictions), double(c.simulated.evictions), 0);
  row("restores", double(c.measured.restores), double(c.simulated.restores), 0);
  row("copy stall s", c.measured.copy_stall_s, c.simulated.copy_stall_s, 3);
  row("preemptions", double(c.measured.preemptions), double(c.simulated.preemptions), 0);
  if (c.ttft_paired.requests > 0)
    t += fmt::format(
        "TTFT request by request, simulated / measured over {} requests: median {:.3f}, p10 {:.3f}, p90 "
        "{:.3f}\n",
        c.ttft_paired.requests, c.ttft_paired.median_ratio, c.ttft_paired.p10_ratio, c.ttft_paired.p90_ratio);
  return t;
}

std::string validation_json(const RunComparison& c, const ValidationLabels& l) {
  nlohmann::ordered_json j;
  j["format"] = "amoeba.validation";
  j["model"] = l.model;
  j["gpu"] = l.gpu;
  j["expert_precision"] = l.expert_precision;
  j["policy"] = l.policy;
  j["workload"] = l.workload;
  if (l.gpu_memory_gib > 0)
    j["memory"] = {{"gpu_memory_gib", l.gpu_memory_gib},
                   {"expert_offload_limit", l.offload_limit},
                   {"experts_resident_per_layer", l.resident_per_layer}};
  nlohmann::ordered_json meas;
  meas["backend"] = l.measured_backend;
  meas["simulated"] = l.measured_simulated;
  if (l.measured_simulated) meas["cost_model"] = l.measured_cost_model;
  j["measured"] = meas;
  j["simulated"] = {{"backend", "sim"}, {"simulated", true}, {"cost_model", l.simulated_cost_model}};
  nlohmann::ordered_json steps;
  steps["pairing"] = std::string(to_string(c.match));
  steps["measured"] = c.measured_steps;
  steps["simulated"] = c.simulated_steps;
  steps["paired"] = c.matched;
  if (c.matched > 0) {
    steps["median_abs_rel_error"] = c.median_abs_rel_error;
    steps["p90_abs_rel_error"] = c.p90_abs_rel_error;
    steps["max_abs_rel_error"] = c.max_abs_rel_error;
    steps["median_rel_error"] = c.median_rel_error;
    steps["abs_error_buckets"] = error_buckets_json(c.errors);
  }
  j["steps"] = steps;
  if (c.priced.steps > 0) {
    nlohmann::ordered_json p;
    p["steps"] = c.priced.steps;
    p["median_abs_rel_error"] = c.priced.median_abs_rel_error;
    p["p90_abs_rel_error"] = c.priced.p90_abs_rel_error;
    p["max_abs_rel_error"] = c.priced.max_abs_rel_error;
    p["median_rel_error"] = c.priced.median_rel_error;
    p["abs_error_buckets"] = error_buckets_json(c.priced.errors);
    nlohmann::ordered_json kinds = nlohmann::ordered_json::object();
    for (const auto& k : c.priced.by_kind)
      kinds[k.kind] = {{"steps", k.steps},
                       {"median_abs_rel_error", k.median_abs_rel_error},
                       {"p90_abs_rel_error", k.p90_abs_rel_error},
                       {"median_rel_error", k.median_rel_error}};
    p["by_kind"] = kinds;
    j["priced_steps"] = p;
  }
  auto e2e = [](const EndToEnd& e) {
    nlohmann::ordered_json o;
    o["throughput_tok_s"] = e.throughput_tok_s;
    o["ttft_p50_ms"] = e.ttft_p50_ms;
    o["tpot_p50_ms"] = e.tpot_p50_ms;
    o["makespan_s"] = e.makespan_s;
    o["forward_steps"] = e.forward_steps;
    o["expert_bytes_h2d"] = e.expert_bytes_h2d;
    o["evictions"] = e.evictions;
    o["restores"] = e.restores;
    o["copy_stall_s"] = e.copy_stall_s;
    o["preemptions"] = e.preemptions;
    return o;
  };
  j["end_to_end"] = {{"measured", e2e(c.measured)}, {"simulated", e2e(c.simulated)}};
  if (c.ttft_paired.requests > 0)
    j["ttft_paired"] = {{"requests", c.ttft_paired.requests},
                        {"median_ratio", c.ttft_paired.median_ratio},
                        {"p10_ratio", c.ttft_paired.p10_ratio},
                        {"p90_ratio", c.ttft_paired.p90_ratio}};
  return j.dump(2) + "\n";
}

}  // namespace amoeba::engine
