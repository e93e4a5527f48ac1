// The cost-model fit and the run comparison; see calibration.hpp for the method.
#include "engine/calibration.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <sstream>
#include <utility>

#include "amoeba/core/errors.hpp"
#include "engine/sim_backend.hpp"

namespace amoeba::engine {

std::string_view to_string(CalibrationPhase p) noexcept {
  switch (p) {
    case CalibrationPhase::kAttention:
      return "attention";
    case CalibrationPhase::kMoe:
      return "moe";
    case CalibrationPhase::kDense:
      return "dense";
    case CalibrationPhase::kStep:
      return "step";
    case CalibrationPhase::kCopy:
      return "copy";
  }
  return "?";
}

std::string_view to_string(StepMatch m) noexcept {
  switch (m) {
    case StepMatch::kByIndex:
      return "by-index";
    case StepMatch::kAligned:
      return "aligned";
    case StepMatch::kNone:
      return "none";
  }
  return "?";
}

namespace {

std::string number(double v) {
  std::ostringstream s;
  s.precision(17);
  s << v;
  return s.str();
}

bool roofline_phase(CalibrationPhase p) noexcept {
  return p == CalibrationPhase::kAttention || p == CalibrationPhase::kMoe || p == CalibrationPhase::kDense;
}

struct Efficiency {
  double memory = 1, compute = 1;
};

Efficiency efficiency_of(CalibrationPhase p, const CostModelParams& c) noexcept {
  switch (p) {
    case CalibrationPhase::kAttention:
      return {c.attention_memory_efficiency, c.attention_compute_efficiency};
    case CalibrationPhase::kMoe:
      return {c.moe_memory_efficiency, c.moe_compute_efficiency};
    default:
      return {c.dense_memory_efficiency, c.dense_compute_efficiency};
  }
}

void set_efficiency(CalibrationPhase p, Efficiency e, CostModelParams& c) noexcept {
  switch (p) {
    case CalibrationPhase::kAttention:
      c.attention_memory_efficiency = e.memory;
      c.attention_compute_efficiency = e.compute;
      return;
    case CalibrationPhase::kMoe:
      c.moe_memory_efficiency = e.memory;
      c.moe_compute_efficiency = e.compute;
      return;
    default:
      c.dense_memory_efficiency = e.memory;
      c.dense_compute_efficiency = e.compute;
  }
}

constexpr double kMinEfficiency = 0.01;  // the smallest a cost-model file accepts (parse_cost_model)
constexpr double kCoarseStep = 0.01, kFineStep = 0.0005;

// The roofline samples of one phase, reduced to what the objective needs.
struct PhaseSamples {
  std::vector<double> mem_s, comp_s;  // bytes / HBM bw, FLOPs / bf16 rate (efficiency 1, overhead 0)
  std::vector<double> layers, seconds;
  std::vector<double> scale;  // a token-scale table's factor held fixed during the search (1 unless given)
  std::vector<double> tokens;
  std::vector<char> in_table;  // the sample may set the phase's token-scale table
};

// Sum of squared relative errors of one phase for efficiencies e and per-layer overhead o.
double phase_objective(const PhaseSamples& s, Efficiency e, double o) noexcept {
  double sum = 0;
  for (std::size_t i = 0; i < s.seconds.size(); ++i) {
    const double r = std::max(s.mem_s[i] / e.memory, s.comp_s[i] / e.compute) * s.scale[i];
    const double err = s.layers[i] * (r + o) / s.seconds[i] - 1.0;
    sum += err * err;
  }
  return sum;
}

// Best efficiencies on the grid for overhead o; ties (equal objective to 1e-12 relative) go to the point
// nearest `start`, which is itself a candidate.
Efficiency search_efficiency(const PhaseSamples& s, double o, Efficiency start, double* objective) {
  Efficiency best = start;
  double best_obj = phase_objective(s, start, o);
  auto distance = [&](Efficiency e) {
    return std::abs(e.memory - start.memory) + std::abs(e.compute - start.compute);
  };
  auto consider = [&](Efficiency e) {
    const double obj = phase_objective(s, e, o);
    const double tie = 1e-12 * std::max(best_obj, 1e-300);
    if (obj < best_obj - tie || (obj <= best_obj + tie && distance(e) < distance(best))) {
      best = e;
      best_obj = std::min(obj, best_obj);
    }
  };
  const int coarse = int(std::lround(1.0 / kCoarseStep));
  for (int m = 1; m <= coarse; ++m)
    for (int c = 1; c <= coarse; ++c) consider({m * kCoarseStep, c * kCoarseStep});
  const Efficiency centre = best;
  const int half = int(std::lround(kCoarseStep / kFineStep));
  for (int dm = -half; dm <= half; ++dm)
    for (int dc = -half; dc <= half; ++dc) {
      const Efficiency e{centre.memory + dm * kFineStep, centre.compute + dc * kFineStep};
      if (e.memory < kMinEfficiency - 1e-12 || e.memory > 1.0 + 1e-12) continue;
      if (e.compute < kMinEfficiency - 1e-12 || e.compute > 1.0 + 1e-12) continue;
      consider({std::clamp(e.memory, kMinEfficiency, 1.0), std::clamp(e.compute, kMinEfficiency, 1.0)});
    }
  if (objective) *objective = best_obj;
  return best;
}

// Least-squares (relative error) overhead for fixed efficiencies over every roofline phase, >= 0.
double closed_form_overhead(const std::array<PhaseSamples, 3>& phases, const std::array<Efficiency, 3>& eff) {
  double num = 0, den = 0;
  for (std::size_t p = 0; p < phases.size(); ++p) {
    const PhaseSamples& s = phases[p];
    for (std::size_t i = 0; i < s.seconds.size(); ++i) {
      const double r = std::max(s.mem_s[i] / eff[p].memory, s.comp_s[i] / eff[p].compute) * s.scale[i];
      const double a = s.layers[i] * r / s.seconds[i], b = s.layers[i] / s.seconds[i];
      num += b * (1.0 - a);
      den += b * b;
    }
  }
  return den > 0 ? std::max(0.0, num / den) : 0.0;
}

double median(std::vector<double> v) {
  return percentiles(std::move(v)).p50;
}

// The token-scale table of one phase (calibration.hpp): knots from groups of the samples with tokens >= 1,
// one per token count up to kExactTokenScaleTokens, half octaves above (keys past every exact one).
std::vector<CostModelParams::TokenScale> fit_token_scale(const PhaseSamples& s, Efficiency e, double o) {
  auto group = [](double tokens) -> long {
    if (tokens <= kExactTokenScaleTokens) return std::lround(tokens);
    return std::lround(kExactTokenScaleTokens) + 1 + std::lround(2.0 * std::log2(tokens));
  };
  std::vector<std::pair<long, std::size_t>> order;  // (group, sample)
  for (std::size_t i = 0; i < s.seconds.size(); ++i)
    if (s.tokens[i] >= 1 && s.in_table[i]) order.emplace_back(group(s.tokens[i]), i);
  std::sort(order.begin(), order.end());
  std::vector<CostModelParams::TokenScale> out;
  for (std::size_t a = 0; a < order.size();) {
    std::size_t b = a;
    std::vector<double> ratio, tokens;
    for (; b < order.size() && order[b].first == order[a].first; ++b) {
      const std::size_t i = order[b].second;
      // Over the factor held fixed (a quantized fit's table sits on top of start's bf16 one).
      const double core = std::max(s.mem_s[i] / e.memory, s.comp_s[i] / e.compute) * s.scale[i];
      const double r = core > 0 ? (s.seconds[i] / s.layers[i] - o) / core : 1.0;
      ratio.push_back(std::clamp(r, kMinTokenScale, kMaxTokenScale));
      tokens.push_back(s.tokens[i]);
    }
    if (ratio.size() >= kMinTokenScaleSamples)
      out.push_back({median(std::move(tokens)), median(std::move(ratio))});
    a = b;
  }
  return out;
}

}  // namespace

void check_samples(const std::vector<CalibrationSample>& samples) {
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const CalibrationSample& s = samples[i];
    const std::string at = "samples[" + std::to_string(i) + "]";
    if (!std::isfinite(s.seconds) || s.seconds <= 0)
      throw ConfigError(at + ".seconds", number(s.seconds), "must be a finite measured time > 0");
    if (!std::isfinite(s.bytes) || s.bytes < 0)
      throw ConfigError(at + ".bytes", number(s.bytes), "must be finite and >= 0");
    if (!std::isfinite(s.flops) || s.flops < 0)
      throw ConfigError(at + ".flops", number(s.flops), "must be finite and >= 0");
    if (!std::isfinite(s.tokens) || s.tokens < 0)
      throw ConfigError(at + ".tokens", number(s.tokens), "must be finite and >= 0");
    if (!std::isfinite(s.distinct) || s.distinct < 0)
      throw ConfigError(at + ".distinct", number(s.distinct), "must be finite and >= 0");
    if (roofline_phase(s.phase)) {
      if (s.layers == 0) throw ConfigError(at + ".layers", "0", "must be >= 1 (the layers the time covers)");
      if (s.bytes == 0 && s.flops == 0)
        throw ConfigError(at + ".bytes", "0",
                          "a " + std::string(to_string(s.phase)) +
                              " sample needs bytes or FLOPs > 0 (its flops are 0 too): nothing to price");
    } else if (s.phase == CalibrationPhase::kCopy) {
      if (s.bytes == 0) throw ConfigError(at + ".bytes", "0", "a copy sample must move bytes > 0");
      if (s.copy_calls == 0) throw ConfigError(at + ".copy_calls", "0", "a copy sample needs >= 1 copy call");
    } else if (!std::isfinite(s.phases_s) || s.phases_s < 0 || s.phases_s > s.seconds) {
      throw ConfigError(at + ".phases_s", number(s.phases_s),
                        "must be finite, >= 0 and <= the step's seconds (" + number(s.seconds) + ")");
    }
  }
}

double predicted_seconds(const CalibrationSample& s, const GpuProfile& gpu, const CostModelParams& params,
                         ExpertPrecision precision) {
  switch (s.phase) {
    case CalibrationPhase::kStep:
      return params.step_overhead_s + s.phases_s;
    case CalibrationPhase::kCopy:
      return copy_time(gpu, params, double(s.copy_calls), s.bytes);
    default: {
      Efficiency e = efficiency_of(s.phase, params);
      double tokens_scale = 1.0;
      if (s.phase == CalibrationPhase::kMoe) {
        const CostModelParams::PrecisionScale& scale = moe_precision_scale(params, precision);
        e.memory *= scale.memory;
        e.compute *= scale.compute;
        tokens_scale = moe_token_factor(params, precision, s.tokens);
      } else if (s.phase == CalibrationPhase::kAttention) {
        tokens_scale = token_scale_at(params.attention_prefill_scale, s.tokens);
      }
      return double(s.layers) * roofline_time(RooflineWork{s.bytes, s.flops}, gpu, e.memory, e.compute,
                                              params.per_layer_overhead_s, tokens_scale);
    }
  }
}

std::vector<CostModelResidual> cost_model_residuals(const std::vector<CalibrationSample>& samples,
                                                    const GpuProfile& gpu, const CostModelParams& params,
                                                    ExpertPrecision precision) {
  std::vector<CostModelResidual> out;
  for (CalibrationPhase p : {CalibrationPhase::kAttention, CalibrationPhase::kMoe, CalibrationPhase::kDense,
                             CalibrationPhase::kStep, CalibrationPhase::kCopy}) {
    std::vector<double> err;
    for (const CalibrationSample& s : samples)
      if (s.phase == p)
        err.push_back(std::abs(predicted_seconds(s, gpu, params, precision) / s.seconds - 1.0));
    if (err.empty()) continue;
    const Percentiles q = percentiles(std::move(err));
    out.push_back(CostModelResidual{std::string(to_string(p)), q.count, q.p50, q.p90});
  }
  return out;
}

namespace {

// Copies: seconds = a u + b x with a = calls x profile latency, b = bytes / profile bandwidth, u the latency
// scale, x = 1 / bandwidth scale; least squares in relative error (both sides divided by seconds), in closed
// form. Copies of one size only (a and b proportional) cannot tell latency from bandwidth: u stays as it is
// and x alone is fitted. u is clamped to [0, 100] and 1 / x to [0.01, 2], the other refitted at the bound.
void fit_copies(const std::vector<CalibrationSample>& samples, const GpuProfile& gpu, CostModelParams& out) {
  double aa = 0, ab = 0, bb = 0, a1 = 0, b1 = 0;  // sums of a a, a b, b b, a, b (all over seconds)
  std::size_t n = 0;
  for (const CalibrationSample& s : samples) {
    if (s.phase != CalibrationPhase::kCopy) continue;
    const double a = double(s.copy_calls) * gpu.h2d_copy_latency_s / s.seconds;
    const double b = s.bytes / gpu.h2d_bandwidth / s.seconds;
    aa += a * a, ab += a * b, bb += b * b, a1 += a, b1 += b;
    ++n;
  }
  if (n == 0 || bb <= 0) return;
  auto x_for = [&](double u) { return std::clamp((b1 - u * ab) / bb, 0.5, 100.0); };  // 1/x in [0.01, 2]
  double u = out.h2d_copy_latency_scale;
  const double det = aa * bb - ab * ab;
  if (aa > 0 && det > 1e-9 * aa * bb) {
    u = std::clamp((a1 * bb - b1 * ab) / det, 0.0, 100.0);
    const double x = x_for(u);
    u = std::clamp((a1 - x * ab) / aa, 0.0, 100.0);  // refitted if x hit its bound; unchanged otherwise
  }
  out.h2d_copy_latency_scale = u;
  out.h2d_bandwidth_scale = 1.0 / x_for(u);
}

}  // namespace

CostModelParams fit_cost_model(const std::vector<CalibrationSample>& samples, const ModelSpec& model,
                               const GpuProfile& gpu, const CostModelParams& start) {
  check_samples(samples);
  if (gpu.gpus != 1)
    throw ConfigError(
        "gpu.gpus", std::to_string(gpu.gpus),
        "calibration fits one GPU (the all-reduces of tensor parallelism are not measured yet)");
  CostModelParams out = start;
  // The roofline fit starts from (and keeps unseen efficiencies at) start's values at the model's precision:
  // a quantized MoE from start's bf16 efficiencies times start's scales for that precision.
  const ExpertPrecision precision = model.expert_precision;
  const bool quantized = precision != ExpertPrecision::kBf16;
  CostModelParams base = start;
  const CostModelParams::PrecisionScale& start_scale = moe_precision_scale(start, precision);
  base.moe_memory_efficiency = std::clamp(start.moe_memory_efficiency * start_scale.memory, 0.01, 1.0);
  base.moe_compute_efficiency = std::clamp(start.moe_compute_efficiency * start_scale.compute, 0.01, 1.0);
  out.calibrated = true;

  constexpr std::array<CalibrationPhase, 3> kRoofline{CalibrationPhase::kAttention, CalibrationPhase::kMoe,
                                                      CalibrationPhase::kDense};
  std::array<PhaseSamples, 3> phases;
  double overhead_hi = std::numeric_limits<double>::infinity();
  std::size_t roofline_samples = 0;
  for (const CalibrationSample& s : samples) {
    if (!roofline_phase(s.phase)) continue;
    PhaseSamples& p = phases[std::size_t(s.phase)];
    p.mem_s.push_back(s.bytes / gpu.hbm_bandwidth);
    p.comp_s.push_back(s.flops / gpu.bf16_flops);
    p.layers.push_back(double(s.layers));
    p.seconds.push_back(s.seconds);
    p.tokens.push_back(s.tokens);
    const double routable = std::min(s.tokens * double(model.top_k), double(model.num_experts));
    p.in_table.push_back(s.phase != CalibrationPhase::kMoe || s.distinct == 0 || s.distinct >= routable);
    // A quantized fit keeps start's MoE table and fits its efficiencies with it applied.
    const bool kept_table = s.phase == CalibrationPhase::kMoe && quantized;
    p.scale.push_back(kept_table ? token_scale_at(start.moe_token_scale, s.tokens) : 1.0);
    overhead_hi = std::min(overhead_hi, s.seconds / double(s.layers));
    ++roofline_samples;
  }

  // A quantized fit's own factors (the precision's scales and table; unused for bf16).
  CostModelParams::PrecisionScale& fitted = precision == ExpertPrecision::kInt8 ? out.int8 : out.int4;
  const std::size_t att = std::size_t(CalibrationPhase::kAttention),
                    moe = std::size_t(CalibrationPhase::kMoe);
  if (roofline_samples > 0 && quantized) {
    // A quantized fit extends start: at start's per-layer overhead, the quantized kernel's MoE efficiencies
    // become the precision's scales over start's bf16 ones (the simulator's MoE efficiency x scale gives them
    // back), and what they leave per token count its own table (on top of start's, the samples' fixed
    // factor); attention, dense, the overheads and the copy fit stay start's (one set per profile, from its
    // bf16 fit), so the fitted file is what a profile keeps.
    const double o = start.per_layer_overhead_s;
    if (!phases[moe].seconds.empty()) {
      const Efficiency e =
          search_efficiency(phases[moe], o, efficiency_of(CalibrationPhase::kMoe, base), nullptr);
      fitted.memory = std::clamp(e.memory / start.moe_memory_efficiency, 0.05, 2.0);
      fitted.compute = std::clamp(e.compute / start.moe_compute_efficiency, 0.05, 2.0);
      fitted.token_scale = fit_token_scale(phases[moe], e, o);
    }
  } else if (roofline_samples > 0) {
    // The profile objective of the overhead: every phase's best efficiencies for it.
    auto fit_at = [&](double o, std::array<Efficiency, 3>& e) {
      double total = 0;
      for (std::size_t p = 0; p < 3; ++p) {
        e[p] = efficiency_of(kRoofline[p], base);
        if (phases[p].seconds.empty()) continue;
        double obj = 0;
        e[p] = search_efficiency(phases[p], o, efficiency_of(kRoofline[p], base), &obj);
        total += obj;
      }
      return total;
    };
    // Golden-section search over [0, overhead_hi]: the overhead cannot exceed a layer's measured time.
    const double phi = (std::sqrt(5.0) - 1.0) / 2.0;
    double lo = 0, hi = overhead_hi;
    double x1 = hi - phi * (hi - lo), x2 = lo + phi * (hi - lo);
    std::array<Efficiency, 3> e1, e2;
    double f1 = fit_at(x1, e1), f2 = fit_at(x2, e2);
    for (int it = 0; it < 48 && hi - lo > 1e-12; ++it) {
      if (f1 <= f2) {
        hi = x2, x2 = x1, f2 = f1, e2 = e1;
        x1 = hi - phi * (hi - lo);
        f1 = fit_at(x1, e1);
      } else {
        lo = x1, x1 = x2, f1 = f2, e1 = e2;
        x2 = lo + phi * (hi - lo);
        f2 = fit_at(x2, e2);
      }
    }
    double o = f1 <= f2 ? x1 : x2;
    std::array<Efficiency, 3> eff = f1 <= f2 ? e1 : e2;
    double best = std::min(f1, f2);
    // Also try the ends of the interval (an overhead of 0 is common), then polish in closed form.
    std::array<Efficiency, 3> e0;
    if (const double f0 = fit_at(0.0, e0); f0 < best) best = f0, o = 0.0, eff = e0;
    const double polished = closed_form_overhead(phases, eff);
    std::array<Efficiency, 3> ep;
    if (const double fp = fit_at(polished, ep); fp <= best) best = fp, o = polished, eff = ep;
    out.per_layer_overhead_s = o;
    for (std::size_t p = 0; p < 3; ++p) set_efficiency(kRoofline[p], eff[p], out);
    // The token-scale tables on what the roofline leaves.
    if (!phases[att].seconds.empty()) out.attention_prefill_scale = fit_token_scale(phases[att], eff[att], o);
    if (!phases[moe].seconds.empty()) out.moe_token_scale = fit_token_scale(phases[moe], eff[moe], o);
  }

  if (!quantized) {
    std::vector<double> step_overheads;
    for (const CalibrationSample& s : samples)
      if (s.phase == CalibrationPhase::kStep) step_overheads.push_back(s.seconds - s.phases_s);
    if (!step_overheads.empty()) out.step_overhead_s = std::max(0.0, median(std::move(step_overheads)));
    fit_copies(samples, gpu, out);
  }

  out.residuals = cost_model_residuals(samples, gpu, out, precision);
  std::size_t counts[5] = {};
  for (const CalibrationSample& s : samples) ++counts[std::size_t(s.phase)];
  std::ostringstream src;
  src << "fit_cost_model (calibration.hpp) from " << samples.size() << " measured samples on " << gpu.name
      << " (attention " << counts[0] << ", moe " << counts[1] << ", dense " << counts[2] << ", step "
      << counts[3] << ", copy " << counts[4] << "); phases without samples keep " << start.name
      << "'s values";
  out.source = src.str();
  return out;
}

namespace {

struct ForwardStep {
  std::size_t row;  // index into the timeline
  std::uint64_t tokens;
  std::uint32_t running;
  double step_ms;
  std::uint32_t decode_seqs;
};

std::vector<ForwardStep> forward_steps(const std::vector<TimelineRow>& timeline, const std::string& which,
                                       bool measured) {
  std::vector<ForwardStep> out;
  for (std::size_t i = 0; i < timeline.size(); ++i) {
    const TimelineRow& r = timeline[i];
    if (!std::isfinite(r.step_ms) || r.step_ms < 0)
      throw ConfigError(which + ".timeline[" + std::to_string(i) + "].step_ms", number(r.step_ms),
                        "must be finite and >= 0");
    if (r.batch_tokens == 0) continue;
    if (measured && r.step_ms == 0)
      throw ConfigError(which + ".timeline[" + std::to_string(i) + "].step_ms", "0",
                        "a measured forward step must take > 0 ms (the relative error divides by it)");
    out.push_back({i, r.batch_tokens, r.running, r.step_ms, r.decode_seqs});
  }
  return out;
}

EndToEnd end_to_end(const RunResult& r) {
  return {r.throughput_tok_s, r.ttft_ms.p50, r.tpot_ms.p50, r.makespan_s,  r.forward_steps,
          r.expert_bytes_h2d, r.evictions,   r.restores,    r.preemptions, r.copy_stall_s};
}

// Median, p90 and max of |e| and the median of e, over non-empty signed relative errors e.
struct ErrorSummary {
  double median_abs = 0, p90_abs = 0, max_abs = 0, median = 0;
};
ErrorSummary summarize(const std::vector<double>& err) {
  std::vector<double> abs_err;
  for (double e : err) abs_err.push_back(std::abs(e));
  ErrorSummary out;
  out.max_abs = *std::max_element(abs_err.begin(), abs_err.end());
  const Percentiles a = percentiles(std::move(abs_err));
  out.median_abs = a.p50;
  out.p90_abs = a.p90;
  out.median = median(err);
  return out;
}

bool same_key(const ForwardStep& a, const ForwardStep& b) noexcept {
  return a.tokens == b.tokens && a.running == b.running;
}

}  // namespace

RunComparison compare_runs(const RunResult& measured, const RunResult& simulated) {
  const std::vector<ForwardStep> m = forward_steps(measured.timeline, "measured", true);
  const std::vector<ForwardStep> s = forward_steps(simulated.timeline, "simulated", false);
  RunComparison out;
  out.measured_steps = m.size();
  out.simulated_steps = s.size();
  out.measured = end_to_end(measured);
  out.simulated = end_to_end(simulated);
  {
    std::vector<double> err;
    // Kinds of step, from the timeline's decode_seqs (sequences adding one token): all, some, none.
    std::vector<std::vector<double>> kind_err(3);
    for (const ForwardStep& f : m) {
      const double p = measured.timeline[f.row].priced_ms;
      if (!std::isfinite(p))
        throw ConfigError("measured.timeline[" + std::to_string(f.row) + "].priced_ms", number(p),
                          "must be finite (< 0: not priced)");
      if (p < 0) continue;
      err.push_back(p / f.step_ms - 1.0);
      const std::size_t kind = f.decode_seqs == f.running ? 0 : (f.decode_seqs > 0 ? 1 : 2);
      kind_err[kind].push_back(err.back());
    }
    static constexpr const char* kKinds[] = {"decode", "mixed", "prefill"};
    for (std::size_t k = 0; k < 3; ++k) {
      if (kind_err[k].empty()) continue;
      const ErrorSummary e = summarize(kind_err[k]);
      out.priced.by_kind.push_back({kKinds[k], kind_err[k].size(), e.median_abs, e.p90_abs, e.median});
    }
    if (!err.empty()) {
      const ErrorSummary e = summarize(err);
      out.priced.steps = err.size();
      out.priced.median_abs_rel_error = e.median_abs;
      out.priced.p90_abs_rel_error = e.p90_abs;
      out.priced.max_abs_rel_error = e.max_abs;
      out.priced.median_rel_error = e.median;
      out.priced.errors = std::move(err);
    }
  }

  if (measured.request_ttft_ms.size() == simulated.request_ttft_ms.size()) {
    std::vector<double> ratio;
    for (std::size_t i = 0; i < measured.request_ttft_ms.size(); ++i) {
      const double a = measured.request_ttft_ms[i], b = simulated.request_ttft_ms[i];
      if (std::isfinite(a) && std::isfinite(b) && a > 0) ratio.push_back(b / a);
    }
    if (!ratio.empty()) {
      const Percentiles q = percentiles(std::move(ratio));
      out.ttft_paired.requests = q.count;
      out.ttft_paired.median_ratio = q.p50;
      out.ttft_paired.p10_ratio = q.p10;
      out.ttft_paired.p90_ratio = q.p90;
    }
  }

  std::vector<std::pair<std::size_t, std::size_t>> pairs;
  bool by_index = m.size() == s.size();
  for (std::size_t i = 0; by_index && i < m.size(); ++i) by_index = same_key(m[i], s[i]);
  if (by_index) {
    for (std::size_t i = 0; i < m.size(); ++i) pairs.emplace_back(i, i);
  } else {
    std::size_t i = 0, j = 0;
    while (i < m.size() && j < s.size()) {
      if (same_key(m[i], s[j])) {
        pairs.emplace_back(i++, j++);
        continue;
      }
      // The nearest resynchronisation (i', j'), smallest skip first, then smaller i'.
      bool found = false;
      for (std::size_t skip = 1; !found && skip <= 2 * kAlignWindow; ++skip)
        for (std::size_t di = 0; di <= skip && !found; ++di) {
          const std::size_t dj = skip - di;
          if (di > kAlignWindow || dj > kAlignWindow || i + di >= m.size() || j + dj >= s.size()) continue;
          if (same_key(m[i + di], s[j + dj])) i += di, j += dj, found = true;
        }
      if (!found) ++i, ++j;  // nothing near: drop both rows and try from the next ones
    }
  }
  if (pairs.empty()) {
    out.match = StepMatch::kNone;
    return out;
  }
  out.match = by_index ? StepMatch::kByIndex : StepMatch::kAligned;
  out.matched = pairs.size();
  for (auto [i, j] : pairs) out.errors.push_back(s[j].step_ms / m[i].step_ms - 1.0);
  const ErrorSummary e = summarize(out.errors);
  out.median_abs_rel_error = e.median_abs;
  out.p90_abs_rel_error = e.p90_abs;
  out.max_abs_rel_error = e.max_abs;
  out.median_rel_error = e.median;
  return out;
}

}  // namespace amoeba::engine
