// The cost-model calibration (engine/calibration.hpp): samples made from known parameters through the
// simulator's own formulas are fitted back (to the grid's resolution without noise, within tolerance with
// 5% noise), bad samples are refused naming the index and the field, the residuals survive the JSON round
// trip, and the run comparison pairs steps by index, by alignment, or not at all.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "amoeba/core/errors.hpp"
#include "engine/calibration.hpp"
#include "engine/calibration_harness.hpp"
#include "engine/gpu.hpp"
#include "engine/model.hpp"
#include "engine/random.hpp"
#include "engine/sim_backend.hpp"

using namespace amoeba;
using namespace amoeba::engine;

namespace {

CostModelParams truth() {
  CostModelParams p;
  p.name = "truth";
  p.attention_memory_efficiency = 0.55, p.attention_compute_efficiency = 0.35;
  p.moe_memory_efficiency = 0.72, p.moe_compute_efficiency = 0.45;
  p.dense_memory_efficiency = 0.85, p.dense_compute_efficiency = 0.65;
  p.per_layer_overhead_s = 22e-6;
  p.step_overhead_s = 700e-6;
  p.h2d_bandwidth_scale = 0.8;
  p.h2d_copy_latency_scale = 2.5;
  return p;
}

StepBatch batch_of(std::uint32_t decodes, std::uint32_t context, std::uint32_t prefill) {
  StepBatch b;
  for (std::uint32_t i = 0; i < decodes; ++i) b.seqs.push_back({i, context, 1, true, {}, {}});
  if (prefill > 0) b.seqs.push_back({decodes, 0, prefill, true, {}, {}});
  for (const SequenceStep& s : b.seqs) {
    b.tokens += s.new_tokens;
    b.sampling_seqs += s.samples;
  }
  return b;
}

// Samples of every phase, memory- and compute-bound, priced by `p`; each time multiplied by
// exp(noise x N(0,1)).
std::vector<CalibrationSample> make_samples(const ModelSpec& m, const GpuProfile& g, const CostModelParams& p,
                                            double noise, std::uint64_t seed) {
  Rng rng(seed, 7);
  auto jitter = [&](double s) { return noise > 0 ? s * std::exp(noise * rng.normal()) : s; };
  std::vector<CalibrationSample> out;
  auto add = [&](CalibrationPhase phase, RooflineWork w, std::uint32_t layers) {
    CalibrationSample s{phase, w.bytes, w.flops, layers};
    s.seconds = jitter(predicted_seconds(s, g, p, m.expert_precision));
    out.push_back(s);
  };
  for (std::uint32_t decodes : {1u, 8u, 64u, 256u})
    for (std::uint32_t prefill : {0u, 512u, 2048u, 8192u}) {
      const StepBatch b = batch_of(decodes, 600, prefill);
      add(CalibrationPhase::kAttention, attention_work(m, 0, b), m.num_layers);
      add(CalibrationPhase::kDense, lm_head_work(m, b.sampling_seqs), 1);
      add(CalibrationPhase::kDense, dense_ffn_work(m, b.tokens), 1);
    }
  for (std::uint64_t tokens : {1u, 16u, 128u, 1024u, 4096u, 16384u})
    for (std::uint64_t experts : {4u, 20u, 60u}) add(CalibrationPhase::kMoe, moe_work(m, tokens, experts), 3);
  // Pages and whole experts, as the copy probe takes them: two sizes per call tell latency from bandwidth.
  for (std::uint64_t calls : {1u, 3u, 30u, 300u})
    for (std::uint64_t per_call : {m.expert_transfer_bytes() / 3, m.expert_transfer_bytes()}) {
      CalibrationSample s{CalibrationPhase::kCopy, double(calls) * double(per_call), 0, 1, calls};
      s.seconds = jitter(predicted_seconds(s, g, p));
      out.push_back(s);
    }
  for (double phases : {5e-3, 20e-3, 80e-3}) {
    CalibrationSample s{CalibrationPhase::kStep, 0, 0, 1, 0, phases};
    s.seconds = phases + jitter(p.step_overhead_s);
    out.push_back(s);
  }
  return out;
}

ModelSpec model_with_dense() {
  ModelSpec m = find_model("qwen1.5-moe-a2.7b");
  m.dense_intermediate_size = 5632;  // dense_ffn_work needs one: the catalog's Qwen1.5 has no dense layer
  return m;
}

}  // namespace

TEST_CASE("calibration: noise-free samples are fitted back to the grid's resolution", "[calibration]") {
  const ModelSpec m = model_with_dense();
  const GpuProfile g = find_gpu("h200");
  const CostModelParams t = truth();
  const auto samples = make_samples(m, g, t, 0.0, 1);
  const CostModelParams f = fit_cost_model(samples, m, g, CostModelParams{});
  CHECK(f.calibrated);
  CHECK(f.source.find("fit_cost_model") != std::string::npos);
  const double grid = 0.0005;
  CHECK(f.attention_memory_efficiency == Approx(t.attention_memory_efficiency).margin(grid));
  CHECK(f.attention_compute_efficiency == Approx(t.attention_compute_efficiency).margin(grid));
  CHECK(f.moe_memory_efficiency == Approx(t.moe_memory_efficiency).margin(grid));
  CHECK(f.moe_compute_efficiency == Approx(t.moe_compute_efficiency).margin(grid));
  CHECK(f.dense_memory_efficiency == Approx(t.dense_memory_efficiency).margin(grid));
  CHECK(f.dense_compute_efficiency == Approx(t.dense_compute_efficiency).margin(grid));
  CHECK(f.per_layer_overhead_s == Approx(t.per_layer_overhead_s).margin(0.1e-6));
  CHECK(f.step_overhead_s == Approx(t.step_overhead_s).epsilon(1e-9));
  CHECK(f.h2d_bandwidth_scale == Approx(t.h2d_bandwidth_scale).epsilon(1e-9));
  CHECK(f.h2d_copy_latency_scale == Approx(t.h2d_copy_latency_scale).epsilon(1e-6));
  REQUIRE(f.residuals.size() == 5);
  for (const CostModelResidual& r : f.residuals) {
    INFO(r.phase);
    CHECK(r.samples > 0);
    CHECK(r.median_abs_rel_error < 1e-4);
    CHECK(r.p90_abs_rel_error < 1e-3);
  }
}

TEST_CASE("calibration: 5% noise is fitted within tolerance, residuals report it", "[calibration]") {
  const ModelSpec m = model_with_dense();
  const GpuProfile g = find_gpu("h200");
  const CostModelParams t = truth();
  std::vector<CalibrationSample> samples;
  for (std::uint64_t seed = 0; seed < 5; ++seed) {
    const auto s = make_samples(m, g, t, 0.05, seed);
    samples.insert(samples.end(), s.begin(), s.end());
  }
  const CostModelParams f = fit_cost_model(samples, m, g, CostModelParams{});
  CHECK(f.attention_memory_efficiency == Approx(t.attention_memory_efficiency).epsilon(0.1));
  CHECK(f.attention_compute_efficiency == Approx(t.attention_compute_efficiency).epsilon(0.1));
  CHECK(f.moe_memory_efficiency == Approx(t.moe_memory_efficiency).epsilon(0.1));
  CHECK(f.moe_compute_efficiency == Approx(t.moe_compute_efficiency).epsilon(0.1));
  CHECK(f.dense_memory_efficiency == Approx(t.dense_memory_efficiency).epsilon(0.1));
  CHECK(f.dense_compute_efficiency == Approx(t.dense_compute_efficiency).epsilon(0.1));
  CHECK(f.per_layer_overhead_s == Approx(t.per_layer_overhead_s).margin(8e-6));
  CHECK(f.step_overhead_s == Approx(t.step_overhead_s).epsilon(0.1));
  CHECK(f.h2d_bandwidth_scale == Approx(t.h2d_bandwidth_scale).epsilon(0.1));
  CHECK(f.h2d_copy_latency_scale == Approx(t.h2d_copy_latency_scale).epsilon(0.5));
  for (const CostModelResidual& r : f.residuals) {
    INFO(r.phase);
    // The noise shows (median |N(0,1)| x 5% ~ 3.4%; a step's noise is on its overhead alone).
    if (r.phase != "step") CHECK(r.median_abs_rel_error > 0.005);
    CHECK(r.median_abs_rel_error < 0.08);
    CHECK(r.p90_abs_rel_error >= r.median_abs_rel_error);
  }
}

TEST_CASE("calibration: phases without samples keep the start's values, unseen bounds stay at start",
          "[calibration]") {
  const ModelSpec m = model_with_dense();
  const GpuProfile g = find_gpu("h200");
  const CostModelParams t = truth();
  // Memory-bound MoE samples only (one token): the compute efficiency cannot be seen.
  std::vector<CalibrationSample> samples;
  for (std::uint64_t experts : {2u, 8u, 30u, 60u}) {
    CalibrationSample s{CalibrationPhase::kMoe, moe_work(m, 1, experts).bytes, moe_work(m, 1, experts).flops,
                        1};
    s.seconds = predicted_seconds(s, g, t);
    samples.push_back(s);
  }
  const CostModelParams start;
  const CostModelParams f = fit_cost_model(samples, m, g, start);
  CHECK(f.moe_memory_efficiency == Approx(t.moe_memory_efficiency).margin(0.0005));
  CHECK(f.moe_compute_efficiency == start.moe_compute_efficiency);
  CHECK(f.attention_memory_efficiency == start.attention_memory_efficiency);
  CHECK(f.dense_compute_efficiency == start.dense_compute_efficiency);
  CHECK(f.step_overhead_s == start.step_overhead_s);
  CHECK(f.h2d_bandwidth_scale == start.h2d_bandwidth_scale);
  CHECK(f.h2d_copy_latency_scale == start.h2d_copy_latency_scale);
  REQUIRE(f.residuals.size() == 1);
  CHECK(f.residuals[0].phase == "moe");
  CHECK(f.residuals[0].samples == 4);
}

TEST_CASE("calibration: copies of one size fit the bandwidth alone, the latency is clamped at 0",
          "[calibration]") {
  const ModelSpec m = model_with_dense();
  const GpuProfile g = find_gpu("h200");
  CostModelParams t = truth();
  auto copies = [&](const CostModelParams& p, std::initializer_list<std::uint64_t> sizes) {
    std::vector<CalibrationSample> out;
    for (std::uint64_t calls : {1u, 4u, 16u})
      for (std::uint64_t per_call : sizes) {
        CalibrationSample s{CalibrationPhase::kCopy, double(calls) * double(per_call), 0, 1, calls};
        s.seconds = predicted_seconds(s, g, p);
        out.push_back(s);
      }
    return out;
  };
  // One size: seconds per call are one number, which the start's latency and a fitted bandwidth reproduce.
  CostModelParams start;
  start.h2d_copy_latency_scale = 1.0;
  CostModelParams f = fit_cost_model(copies(t, {m.expert_transfer_bytes()}), m, g, start);
  CHECK(f.h2d_copy_latency_scale == start.h2d_copy_latency_scale);
  REQUIRE(f.residuals.size() == 1);
  CHECK(f.residuals[0].p90_abs_rel_error < 1e-9);
  // Copies faster per call than any positive latency allows: the latency scale stops at 0.
  t.h2d_copy_latency_scale = 0;
  std::vector<CalibrationSample> s = copies(t, {1u << 20, 16u << 20});
  for (CalibrationSample& c : s) c.seconds -= 0.5 * double(c.copy_calls) * g.h2d_copy_latency_s;
  f = fit_cost_model(s, m, g, start);
  CHECK(f.h2d_copy_latency_scale == 0.0);
  CHECK(f.h2d_bandwidth_scale > t.h2d_bandwidth_scale);
}

TEST_CASE("calibration: bad samples are refused naming the index and the field", "[calibration]") {
  const ModelSpec m = model_with_dense();
  const GpuProfile g = find_gpu("h200");
  const CalibrationSample good{CalibrationPhase::kMoe, 1e9, 1e9, 1, 0, 0, 1e-3};
  auto refused = [&](CalibrationSample bad, const std::string& field) {
    std::vector<CalibrationSample> v{good, good, bad};
    try {
      (void)fit_cost_model(v, m, g, CostModelParams{});
      FAIL("accepted a bad sample for " << field);
    } catch (const ConfigError& e) {
      CHECK(e.field() == "samples[2]." + field);
      CHECK(!e.rule().empty());
    }
  };
  CalibrationSample s = good;
  s.seconds = -1e-3;
  refused(s, "seconds");
  s.seconds = std::nan("");
  refused(s, "seconds");
  s = good;
  s.bytes = 0, s.flops = 0;
  refused(s, "bytes");
  s = good;
  s.flops = std::nan("");
  refused(s, "flops");
  s = good;
  s.layers = 0;
  refused(s, "layers");
  s = {CalibrationPhase::kCopy, 1e6, 0, 1, 0, 0, 1e-3};
  refused(s, "copy_calls");
  s = {CalibrationPhase::kStep, 0, 0, 1, 0, 2e-3, 1e-3};
  refused(s, "phases_s");

  CHECK_THROWS_AS(fit_cost_model({good}, m, find_gpu("2x-rtx5090"), CostModelParams{}), ConfigError);
}

TEST_CASE("calibration on quantized experts: the MoE fit becomes the precision's scales, start's bf16 kept",
          "[calibration]") {
  const GpuProfile g = find_gpu("h200");
  for (const ExpertPrecision p : {ExpertPrecision::kInt8, ExpertPrecision::kInt4}) {
    INFO(to_string(p));
    ModelSpec m = model_with_dense();
    m.expert_precision = p;
    CostModelParams t = truth();
    auto& ts = p == ExpertPrecision::kInt8 ? t.int8 : t.int4;
    ts = {0.62, 0.7, {}};  // the quantized kernel: 0.72 x 0.62 of the bandwidth, 0.45 x 0.7 of the FLOP rate
    const std::vector<CalibrationSample> samples = make_samples(m, g, t, 0.0, 1);
    // Start from the truth's bf16 MoE efficiencies and overhead with the default scales: a bf16 profile being
    // extended, whose other phases were fitted on another run (they differ from this run's truth).
    CostModelParams start = t;
    start.int8 = CostModelParams{}.int8;
    start.int4 = CostModelParams{}.int4;
    start.moe_token_scale = {{1, 1.0}, {4096, 1.0}};  // neutral: the bf16 profile's table, kept as it is
    start.attention_memory_efficiency *= 0.9;
    start.attention_compute_efficiency *= 0.8;
    start.dense_memory_efficiency *= 0.95;
    start.attention_prefill_scale = {{32, 1.1}, {1024, 0.9}};
    start.step_overhead_s += 40e-6;
    start.h2d_bandwidth_scale *= 0.9;
    start.h2d_copy_latency_scale *= 1.5;
    const CostModelParams f = fit_cost_model(samples, m, g, start);
    CHECK(f.moe_token_scale == start.moe_token_scale);
    CHECK(f.moe_memory_efficiency == t.moe_memory_efficiency);  // start's bf16 values, untouched
    CHECK(f.moe_compute_efficiency == t.moe_compute_efficiency);
    // Everything but the precision's MoE fields is start's: the profile keeps one set (its bf16 fit's).
    CHECK(f.attention_memory_efficiency == start.attention_memory_efficiency);
    CHECK(f.attention_compute_efficiency == start.attention_compute_efficiency);
    CHECK(f.dense_memory_efficiency == start.dense_memory_efficiency);
    CHECK(f.dense_compute_efficiency == start.dense_compute_efficiency);
    CHECK(f.attention_prefill_scale == start.attention_prefill_scale);
    CHECK(f.per_layer_overhead_s == start.per_layer_overhead_s);
    CHECK(f.step_overhead_s == start.step_overhead_s);
    CHECK(f.h2d_bandwidth_scale == start.h2d_bandwidth_scale);
    CHECK(f.h2d_copy_latency_scale == start.h2d_copy_latency_scale);
    const auto& fs = p == ExpertPrecision::kInt8 ? f.int8 : f.int4;
    const auto& other = p == ExpertPrecision::kInt8 ? f.int4 : f.int8;
    const auto& other_start = p == ExpertPrecision::kInt8 ? start.int4 : start.int8;
    // The grid's resolution (0.0005 in efficiency) over the bf16 efficiency.
    CHECK(fs.memory == Approx(ts.memory).margin(0.0005 / t.moe_memory_efficiency + 1e-9));
    CHECK(fs.compute == Approx(ts.compute).margin(0.0005 / t.moe_compute_efficiency + 1e-9));
    CHECK(other.memory == other_start.memory);  // the other precision is not measured
    CHECK(other.compute == other_start.compute);
    for (const CostModelResidual& r : f.residuals)
      if (r.phase == "moe") CHECK(r.p90_abs_rel_error < 2e-3);
  }
}

TEST_CASE("calibration on quantized experts: the precision's own token-scale table is learnt",
          "[calibration]") {
  const GpuProfile g = find_gpu("h200");
  for (const ExpertPrecision p : {ExpertPrecision::kInt8, ExpertPrecision::kInt4}) {
    INFO(to_string(p));
    ModelSpec m = model_with_dense();  // 60 experts, top-4
    m.expert_precision = p;
    CostModelParams t = truth();
    t.moe_token_scale = {{1, 1.2}, {64, 0.8}, {1024, 1.1}};  // the bf16 profile's table, kept
    auto& ts = p == ExpertPrecision::kInt8 ? t.int8 : t.int4;
    // The quantized kernel: its own bend on top, 0.5x at 1 token to 2x at 1024.
    ts = {0.8, 0.7, {{1, 0.5}, {16, 0.9}, {256, 1.4}, {1024, 2.0}}};
    std::vector<CalibrationSample> samples;
    for (const double tokens : {1.0, 2.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0})
      for (int rep = 0; rep < 2; ++rep) {
        const std::uint64_t distinct = std::uint64_t(std::min(tokens * m.top_k, double(m.num_experts)));
        const RooflineWork w = moe_work(m, std::uint64_t(tokens), distinct);
        CalibrationSample s{CalibrationPhase::kMoe, w.bytes, w.flops, 3};
        s.tokens = tokens, s.distinct = double(distinct);
        s.seconds = predicted_seconds(s, g, t, p);
        samples.push_back(s);
      }
    CostModelParams start = t;  // a bf16 profile being extended: default scales, no quantized table
    start.int8 = CostModelParams{}.int8;
    start.int4 = CostModelParams{}.int4;
    const CostModelParams f = fit_cost_model(samples, m, g, start);
    CHECK(f.moe_token_scale == t.moe_token_scale);  // start's bf16 table, untouched
    const auto& fs = p == ExpertPrecision::kInt8 ? f.int8 : f.int4;
    CHECK(fs.token_scale.size() == 8);  // one knot per token count (a group of 2 samples each)
    for (const CalibrationSample& s : samples) {
      INFO("tokens " << s.tokens);
      CHECK(predicted_seconds(s, g, f, p) / s.seconds == Approx(1.0).epsilon(0.01));
    }
    // Without the precision's table the same fit misses (one pair of scales cannot bend with tokens).
    CostModelParams flat = f;
    (p == ExpertPrecision::kInt8 ? flat.int8 : flat.int4).token_scale.clear();
    double worst = 0;
    for (const CalibrationSample& s : samples)
      worst = std::max(worst, std::abs(predicted_seconds(s, g, flat, p) / s.seconds - 1.0));
    CHECK(worst > 0.15);  // 19–22% here
    // The table survives the file, and the simulator prices a quantized MoE with it.
    const CostModelParams back = parse_cost_model(cost_model_to_json(f), "fitted");
    CHECK((p == ExpertPrecision::kInt8 ? back.int8 : back.int4).token_scale == fs.token_scale);
    CHECK(moe_token_factor(back, p, 1024) ==
          Approx(token_scale_at(t.moe_token_scale, 1024) * token_scale_at(fs.token_scale, 1024)));
    CHECK(moe_token_factor(back, ExpertPrecision::kBf16, 1024) == token_scale_at(t.moe_token_scale, 1024));
  }
}

TEST_CASE("cost model JSON: residuals round trip, files without them parse", "[calibration]") {
  const ModelSpec m = model_with_dense();
  const GpuProfile g = find_gpu("h200");
  const CostModelParams f = fit_cost_model(make_samples(m, g, truth(), 0.05, 3), m, g, CostModelParams{});
  REQUIRE(f.residuals.size() == 5);
  const std::string text = cost_model_to_json(f);
  CHECK(text.find("\"residuals\"") != std::string::npos);
  const CostModelParams back = parse_cost_model(text, "fitted");
  CHECK(back.residuals == f.residuals);
  CHECK(back.calibrated);
  CHECK(back.moe_memory_efficiency == f.moe_memory_efficiency);
  CHECK(back.per_layer_overhead_s == Approx(f.per_layer_overhead_s).epsilon(1e-12));
  CHECK(cost_model_to_json(back) == text);

  const CostModelParams d = find_cost_model("default");
  CHECK(d.residuals.empty());
  CHECK(cost_model_to_json(d).find("residuals") == std::string::npos);

  auto with = [&](const std::string& residuals) {
    std::string t = cost_model_to_json(d);
    t.insert(t.rfind('}'), ", \"residuals\": " + residuals);
    return t;
  };
  CHECK_THROWS_WITH(parse_cost_model(with(R"({"moe": {"samples": 0, "median_abs_rel_error": 0.1,
                                               "p90_abs_rel_error": 0.2}})"),
                                     "f"),
                    Catch::Contains("samples") && Catch::Contains("0"));
  CHECK_THROWS_WITH(parse_cost_model(with(R"({"kv": {}})"), "f"), Catch::Contains("kv"));
  CHECK_THROWS_WITH(parse_cost_model(with(R"({"moe": {"samples": 3, "median_abs_rel_error": 0.3,
                                               "p90_abs_rel_error": 0.2}})"),
                                     "f"),
                    Catch::Contains("p90_abs_rel_error") && Catch::Contains("median_abs_rel_error"));
}

TEST_CASE("cost model token-scale tables: interpolation in log2(tokens), JSON round trip, bad knots refused",
          "[calibration]") {
  using K = CostModelParams::TokenScale;
  const std::vector<K> t{{1, 2.0}, {4, 1.0}, {64, 1.5}};
  CHECK(token_scale_at({}, 100) == 1.0);
  CHECK(token_scale_at(t, 0) == 1.0);    // no tokens: not scaled
  CHECK(token_scale_at(t, 0.5) == 2.0);  // below the first knot: the first
  CHECK(token_scale_at(t, 1) == 2.0);
  CHECK(token_scale_at(t, 2) == Approx(1.5));  // half way between 1 and 4 in log2
  CHECK(token_scale_at(t, 4) == 1.0);
  CHECK(token_scale_at(t, 8) == Approx(1.125));  // a quarter of the way from 4 to 64
  CHECK(token_scale_at(t, 64) == 1.5);
  CHECK(token_scale_at(t, 1e6) == 1.5);  // beyond the last: the last

  CostModelParams p = find_cost_model("default");
  CHECK(p.moe_token_scale.empty());
  CHECK(cost_model_to_json(p).find("token_scale") == std::string::npos);
  p.moe_token_scale = t;
  p.attention_prefill_scale = {{32, 1.25}};
  const std::string text = cost_model_to_json(p);
  const CostModelParams back = parse_cost_model(text, "tables");
  CHECK(back.moe_token_scale == t);
  CHECK(back.attention_prefill_scale == p.attention_prefill_scale);
  CHECK(parse_cost_model(cost_model_to_json(back), "again").moe_token_scale == t);

  auto with = [&](const std::string& table) {
    std::string x = cost_model_to_json(find_cost_model("default"));
    x.insert(x.rfind('}'), ", \"moe_token_scale\": " + table);
    return x;
  };
  CHECK_THROWS_WITH(parse_cost_model(with(R"([{"tokens": 4, "scale": 1}, {"tokens": 4, "scale": 2}])"), "f"),
                    Catch::Contains("moe_token_scale[1].tokens") && Catch::Contains("increasing"));
  CHECK_THROWS_WITH(parse_cost_model(with(R"([{"tokens": 4, "scale": 0.01}])"), "f"),
                    Catch::Contains("moe_token_scale[0].scale"));
  CHECK_THROWS_WITH(parse_cost_model(with(R"([{"tokens": 0.5, "scale": 1}])"), "f"),
                    Catch::Contains("moe_token_scale[0].tokens"));
  CHECK_THROWS_WITH(parse_cost_model(with(R"([{"tokens": 4, "scale": 1, "x": 1}])"), "f"),
                    Catch::Contains("x"));
  CHECK_THROWS_WITH(parse_cost_model(with(R"({"tokens": 4})"), "f"), Catch::Contains("must be an array"));
  CHECK_THROWS_WITH(parse_cost_model(with(R"([4])"), "f"), Catch::Contains("moe_token_scale[0]"));
}

TEST_CASE("calibration: the MoE token-scale table is fitted from samples at the routable maximum of experts",
          "[calibration]") {
  const ModelSpec m = model_with_dense();  // 60 experts, top-4
  const GpuProfile g = find_gpu("h200");
  std::vector<CalibrationSample> samples = make_samples(m, g, truth(), 0.0, 1);  // tokens 0: no table
  // 200 tokens: spread over all 60 experts 1.25x the roofline, crowded on 4 (a skewed router) 3x.
  for (const double distinct : {60.0, 4.0})
    for (int rep = 0; rep < 3; ++rep) {
      const RooflineWork w = moe_work(m, 200, std::uint64_t(distinct));
      CalibrationSample s{CalibrationPhase::kMoe, w.bytes, w.flops, 3};
      s.tokens = 200, s.distinct = distinct;
      const double core = std::max(w.bytes / (g.hbm_bandwidth * truth().moe_memory_efficiency),
                                   w.flops / (g.bf16_flops * truth().moe_compute_efficiency));
      s.seconds = 3 * (core * (distinct == 60 ? 1.25 : 3.0) + truth().per_layer_overhead_s);
      samples.push_back(s);
    }
  const CostModelParams f = fit_cost_model(samples, m, g, CostModelParams{});
  REQUIRE(f.moe_token_scale.size() == 1);  // one group of >= 2 samples: the spread ones at 200 tokens
  CHECK(f.moe_token_scale[0].tokens == 200);
  for (const CalibrationSample& s : samples)
    if (s.tokens == 200) {
      INFO("distinct " << s.distinct);
      const double err = predicted_seconds(s, g, f) / s.seconds - 1.0;
      if (s.distinct == 60)
        CHECK(std::abs(err) < 1e-3);  // learnt
      else
        CHECK(err < -0.4);  // not learnt: the skewed samples are left to the roofline
    }
  CalibrationSample bad = samples.front();
  bad.distinct = -1;
  CHECK_THROWS_WITH(fit_cost_model({bad}, m, g, CostModelParams{}), Catch::Contains("samples[0].distinct"));
}

namespace {

RunResult run_of(const std::vector<std::pair<std::uint64_t, double>>& steps) {  // (batch tokens, step ms)
  RunResult r;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    TimelineRow row;
    row.step = i;
    row.batch_tokens = steps[i].first;
    row.running = std::uint32_t(steps[i].first > 100 ? 4 : steps[i].first);
    row.step_ms = steps[i].second;
    r.timeline.push_back(row);
  }
  r.forward_steps = steps.size();
  return r;
}

}  // namespace

TEST_CASE("compare_runs: same schedule pairs by index", "[calibration]") {
  RunResult meas = run_of({{512, 10}, {4, 2}, {4, 2}, {0, 0}, {3, 4}});
  RunResult sim = run_of({{512, 11}, {4, 2}, {4, 1}, {0, 0}, {3, 4}});
  meas.throughput_tok_s = 100, sim.throughput_tok_s = 120;
  meas.ttft_ms.p50 = 5, sim.ttft_ms.p50 = 6;
  const RunComparison c = compare_runs(meas, sim);
  CHECK(c.match == StepMatch::kByIndex);
  CHECK(c.measured_steps == 4);  // the idle row does not count
  CHECK(c.matched == 4);
  // errors 0.1, 0, 0.5, 0 -> sorted 0 0 0.1 0.5
  CHECK(c.median_abs_rel_error == Approx(0.05));
  CHECK(c.max_abs_rel_error == Approx(0.5));
  CHECK(c.p90_abs_rel_error == Approx(0.38));
  CHECK(c.median_rel_error == Approx(0).margin(1e-12));  // signed: -0.5, 0, 0, 0.1
  REQUIRE(c.errors.size() == 4);                         // each pair's signed error, in order
  CHECK(c.errors[0] == Approx(0.1));
  CHECK(c.errors[1] == Approx(0).margin(1e-12));
  CHECK(c.errors[2] == Approx(-0.5));
  CHECK(c.errors[3] == Approx(0).margin(1e-12));
  CHECK(c.measured.throughput_tok_s == 100);
  CHECK(c.simulated.ttft_p50_ms == 6);
  CHECK(c.priced.steps == 0);  // the measured run was not priced
}

TEST_CASE("compare_runs: TTFT request by request, over requests finished in both runs", "[calibration]") {
  RunResult meas = run_of({{512, 10}, {4, 2}});
  RunResult sim = run_of({{512, 11}, {4, 2}});
  const double nan = std::numeric_limits<double>::quiet_NaN();
  meas.request_ttft_ms = {10, 20, 40, nan, 0, 30};
  sim.request_ttft_ms = {11, 18, 40, 5, 7, 33};
  const RunComparison c = compare_runs(meas, sim);
  CHECK(c.ttft_paired.requests == 4);  // not the one unfinished, nor the measured 0
  CHECK(c.ttft_paired.median_ratio == Approx(1.05));
  CHECK(c.ttft_paired.p90_ratio == Approx(1.1));
  CHECK(c.ttft_paired.p10_ratio == Approx(0.93));
  const std::string text = validation_text(c, ValidationLabels{});
  CHECK_THAT(text,
             Catch::Contains("TTFT request by request, simulated / measured over 4 requests: median 1.050"));
  CHECK(validation_json(c, ValidationLabels{}).find("\"ttft_paired\"") != std::string::npos);
  // The report names the experts' precision, bf16 unless told.
  CHECK_THAT(text, Catch::Contains(", bf16 experts, policy"));
  ValidationLabels int8;
  int8.expert_precision = "int8";
  CHECK_THAT(validation_text(c, int8), Catch::Contains(", int8 experts, policy"));
  CHECK_THAT(validation_json(c, int8), Catch::Contains("\"expert_precision\": \"int8\""));
  // The memory line and object where the plan is given: the GPU memory (or cap), the offload limit and the
  // initial residency; none without it.
  CHECK(text.find("GPU memory") == std::string::npos);
  CHECK(validation_json(c, int8).find("\"memory\"") == std::string::npos);
  int8.gpu_memory_gib = 32;
  int8.offload_limit = 40;
  int8.resident_per_layer = 60;
  CHECK_THAT(validation_text(c, int8),
             Catch::Contains(
                 "GPU memory 32.00 GiB, at most 40 experts per layer offloaded, 60 resident at the start"));
  CHECK_THAT(validation_json(c, int8), Catch::Contains("\"expert_offload_limit\": 40") &&
                                           Catch::Contains("\"experts_resident_per_layer\": 60") &&
                                           Catch::Contains("\"gpu_memory_gib\": 32.0"));
  sim.request_ttft_ms.pop_back();  // runs of different traces: nothing to pair
  CHECK(compare_runs(meas, sim).ttft_paired.requests == 0);
  CHECK(validation_json(compare_runs(meas, sim), ValidationLabels{}).find("ttft_paired") ==
        std::string::npos);
}

TEST_CASE("compare_runs: each priced measured step against its own price", "[calibration]") {
  RunResult meas = run_of({{512, 10}, {4, 2}, {0, 0}, {4, 4}, {3, 4}});
  const RunResult sim = run_of({{9, 1}});  // no pair: the prices still compare
  meas.timeline[0].priced_ms = 12;         // +20%
  meas.timeline[1].priced_ms = 1;          // -50%
  meas.timeline[2].priced_ms = 5;          // no forward: ignored
  meas.timeline[3].priced_ms = 4;          // 0
  // timeline[4]: not priced (-1)
  const RunComparison c = compare_runs(meas, sim);
  CHECK(c.match == StepMatch::kNone);
  REQUIRE(c.priced.steps == 3);
  REQUIRE(c.priced.errors.size() == 3);
  CHECK(c.priced.errors[0] == Approx(0.2));
  CHECK(c.priced.errors[1] == Approx(-0.5));
  CHECK(c.priced.errors[2] == Approx(0).margin(1e-12));
  CHECK(c.priced.median_abs_rel_error == Approx(0.2));
  CHECK(c.priced.max_abs_rel_error == Approx(0.5));
  CHECK(c.priced.median_rel_error == Approx(0).margin(1e-12));
  // By kind (decode_seqs of running): step 0 has 4 running and 1 decode (mixed), steps 1 and 3 are decodes.
  meas.timeline[0].decode_seqs = 1;
  meas.timeline[1].decode_seqs = 4;
  meas.timeline[3].decode_seqs = 4;
  const RunComparison k = compare_runs(meas, sim);
  REQUIRE(k.priced.by_kind.size() == 2);
  CHECK(k.priced.by_kind[0].kind == "decode");
  CHECK(k.priced.by_kind[0].steps == 2);
  CHECK(k.priced.by_kind[0].median_abs_rel_error == Approx(0.25));  // |-0.5| and 0
  CHECK(k.priced.by_kind[1].kind == "mixed");
  CHECK(k.priced.by_kind[1].steps == 1);
  CHECK(k.priced.by_kind[1].median_rel_error == Approx(0.2));
  meas.timeline[3].priced_ms = std::nan("");
  CHECK_THROWS_WITH(compare_runs(meas, sim), Catch::Contains("measured.timeline[3].priced_ms"));
}

TEST_CASE("compare_runs: diverged schedules align on (batch tokens, running), none -> end to end only",
          "[calibration]") {
  // The measured run splits a prefill differently: steps 1-2 have no counterpart.
  const RunResult meas = run_of({{512, 10}, {300, 8}, {212, 6}, {4, 2}, {4, 2}});
  const RunResult sim = run_of({{512, 10}, {4, 3}, {4, 2}});
  const RunComparison c = compare_runs(meas, sim);
  CHECK(c.match == StepMatch::kAligned);
  CHECK(c.matched == 3);
  CHECK(c.max_abs_rel_error == Approx(0.5));

  const RunComparison none = compare_runs(run_of({{7, 1}}), run_of({{9, 1}}));
  CHECK(none.match == StepMatch::kNone);
  CHECK(none.matched == 0);

  RunResult bad = run_of({{7, 1}, {8, 0}});
  CHECK_THROWS_WITH(compare_runs(bad, sim), Catch::Contains("measured.timeline[1].step_ms"));
  bad = run_of({{7, std::nan("")}});
  CHECK_THROWS_WITH(compare_runs(meas, bad), Catch::Contains("simulated.timeline[0].step_ms"));
}
