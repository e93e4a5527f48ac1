// GPU profiles and cost-model parameters; see gpu.hpp.
#include "engine/gpu.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "amoeba/core/errors.hpp"
#include "engine/embedded_data.hpp"
#include "engine/json_fields.hpp"

namespace amoeba::engine {

std::string_view to_string(MoeKernel k) noexcept {
  return k == MoeKernel::kPaged ? "paged" : "gather";
}

MoeKernel moe_kernel_from_string(const std::string& s, const std::string& field) {
  if (s == "paged") return MoeKernel::kPaged;
  if (s == "gather") return MoeKernel::kGather;
  throw ConfigError(field, s, "must be paged or gather");
}

namespace {
GpuProfile parse_gpu_with(std::string_view json_text, const std::string& what,
                          const std::vector<GpuProfile>& bases) {
  const nlohmann::json j = parse_json_text(json_text, what);
  const JsonObject o(j, what);
  o.reject_unknown({"name", "description", "base", "gpus", "interconnect", "memory_mib", "hbm_bandwidth_gbs",
                    "bf16_tflops", "h2d_bandwidth_gbs", "h2d_copy_latency_us", "cuda_context_mib",
                    "sources"});
  GpuProfile g;
  const bool has_base = o.has("base");
  if (has_base) {
    const std::string b = o.get_string("base");
    std::string known;
    const GpuProfile* found = nullptr;
    for (const GpuProfile& p : bases) {
      if (p.gpus != 1) continue;
      if (p.name == b) found = &p;
      known += (known.empty() ? "" : ", ") + p.name;
    }
    if (!found) throw ConfigError(what + ".base", b, "must name a one-GPU profile (known: " + known + ")");
    g = *found;
    g.base = b;
  }
  g.name = o.get_string("name");
  if (g.name.empty()) throw ConfigError(what + ".name", "\"\"", "must not be empty");
  g.description = o.get_string_or("description", g.description);
  // Per-GPU numbers: required without a base, optional overrides with one.
  auto num = [&](std::string_view key, double current, double lo, double hi) {
    return has_base ? o.get_double_or(key, current, lo, hi) : o.get_double(key, lo, hi);
  };
  g.memory_bytes = (has_base ? o.get_uint_or("memory_mib", g.memory_bytes >> 20, 64, 1u << 24)
                             : o.get_uint("memory_mib", 64, 1u << 24))
                   << 20;
  g.hbm_bandwidth = num("hbm_bandwidth_gbs", g.hbm_bandwidth / 1e9, 1.0, 1e6) * 1e9;
  g.bf16_flops = num("bf16_tflops", g.bf16_flops / 1e12, 0.1, 1e6) * 1e12;
  g.h2d_bandwidth = num("h2d_bandwidth_gbs", g.h2d_bandwidth / 1e9, 0.1, 1e4) * 1e9;
  g.h2d_copy_latency_s = num("h2d_copy_latency_us", g.h2d_copy_latency_s * 1e6, 0.0, 1e6) * 1e-6;
  g.cuda_context_bytes =
      o.get_uint_or("cuda_context_mib", has_base ? g.cuda_context_bytes >> 20 : 500, 0, 1u << 20) << 20;
  g.gpus = static_cast<std::uint32_t>(o.get_uint_or("gpus", 1, 1, 64));
  if (g.gpus > 1 && !o.has("interconnect"))
    throw ConfigError(what + ".interconnect", "(missing)",
                      "is required when gpus > 1 (the all-reduces of tensor parallelism cross it)");
  if (o.has("interconnect")) {
    const JsonObject ic = o.get_object("interconnect");
    ic.reject_unknown({"description", "allreduce_bus_bandwidth_gbs", "allreduce_latency_us"});
    g.interconnect = ic.get_string_or("description", "");
    g.allreduce_bus_bandwidth = ic.get_double("allreduce_bus_bandwidth_gbs", 0.1, 1e4) * 1e9;
    g.allreduce_latency_s = ic.get_double("allreduce_latency_us", 0.0, 1e5) * 1e-6;
  }
  if (o.has("sources")) {
    const JsonObject s = o.get_object("sources");
    for (auto it = s.raw().begin(); it != s.raw().end(); ++it) {
      const std::string text = s.get_string(it.key());
      auto same = std::find_if(g.sources.begin(), g.sources.end(),
                               [&](const auto& f) { return f.first == it.key(); });
      if (same != g.sources.end())
        same->second = text;
      else
        g.sources.emplace_back(it.key(), text);
    }
  }
  return g;
}
}  // namespace

GpuProfile parse_gpu(std::string_view json_text, const std::string& what) {
  return parse_gpu_with(json_text, what, gpu_catalog());
}

const std::vector<GpuProfile>& gpu_catalog() {
  // One-GPU profiles first, then the multi-GPU machines built on them (`base`).
  static const std::vector<GpuProfile> catalog = [] {
    std::vector<GpuProfile> v;
    for (int pass = 0; pass < 2; ++pass)
      for (const EmbeddedFile& f : embedded_gpu_files()) {
        const bool based = nlohmann::json::parse(f.text).contains("base");
        if (based == (pass == 1)) v.push_back(parse_gpu_with(f.text, "gpu file " + std::string(f.name), v));
      }
    return v;
  }();
  return catalog;
}

GpuProfile find_gpu(const std::string& name_or_path) {
  if (name_or_path.size() > 5 && name_or_path.ends_with(".json"))
    return parse_gpu(read_text_file(name_or_path, "--gpu", kMaxConfigFileBytes), name_or_path);
  std::string known;
  for (const GpuProfile& g : gpu_catalog()) {
    if (g.name == name_or_path) return g;
    known += (known.empty() ? "" : ", ") + g.name;
  }
  throw ConfigError("--gpu", quote_text(name_or_path),
                    "unknown GPU (known: " + known + ", or a path to a .json file)");
}

namespace {

std::vector<CostModelParams::TokenScale> token_scale_table(const JsonObject& o, std::string_view key) {
  std::vector<CostModelParams::TokenScale> out;
  if (!o.has(key)) return out;
  const std::string path = o.path() + "." + std::string(key);
  const nlohmann::json& a = o.raw().at(std::string(key));
  if (!a.is_array())
    throw ConfigError(path, quote_json(a), "must be an array of {\"tokens\": t, \"scale\": f} knots");
  if (a.size() > kMaxTokenScaleKnots)
    throw ConfigError(path, std::to_string(a.size()) + " knots",
                      "must hold at most " + std::to_string(kMaxTokenScaleKnots) + " knots");
  for (std::size_t i = 0; i < a.size(); ++i) {
    const std::string at = path + "[" + std::to_string(i) + "]";
    if (!a[i].is_object()) throw ConfigError(at, quote_json(a[i]), "must be an object {tokens, scale}");
    const JsonObject k(a[i], at);
    k.reject_unknown({"tokens", "scale"});
    CostModelParams::TokenScale t;
    t.tokens = k.get_double("tokens", 1.0, 1e9);
    t.scale = k.get_double("scale", kMinTokenScale, kMaxTokenScale);
    if (!out.empty() && !(t.tokens > out.back().tokens))
      throw ConfigError(k.path() + ".tokens", std::to_string(t.tokens),
                        "must exceed the previous knot's tokens (" + std::to_string(out.back().tokens) +
                            "): knots in increasing order");
    out.push_back(t);
  }
  return out;
}

}  // namespace

double token_scale_at(const std::vector<CostModelParams::TokenScale>& table, double tokens) noexcept {
  if (table.empty() || !(tokens > 0)) return 1.0;
  if (tokens <= table.front().tokens) return table.front().scale;
  if (tokens >= table.back().tokens) return table.back().scale;
  const auto hi =
      std::upper_bound(table.begin(), table.end(), tokens,
                       [](double t, const CostModelParams::TokenScale& k) { return t < k.tokens; });
  const auto lo = hi - 1;
  const double f = std::log2(tokens / lo->tokens) / std::log2(hi->tokens / lo->tokens);
  return lo->scale + f * (hi->scale - lo->scale);
}

CostModelParams parse_cost_model(std::string_view json_text, const std::string& what) {
  const nlohmann::json j = parse_json_text(json_text, what);
  const JsonObject o(j, what);
  o.reject_unknown({"name",
                    "calibrated",
                    "source",
                    "moe_memory_efficiency",
                    "moe_compute_efficiency",
                    "dense_memory_efficiency",
                    "dense_compute_efficiency",
                    "attention_memory_efficiency",
                    "attention_compute_efficiency",
                    "per_layer_overhead_us",
                    "step_overhead_us",
                    "h2d_bandwidth_scale",
                    "h2d_copy_latency_scale",
                    "int8_moe_memory_scale",
                    "int8_moe_compute_scale",
                    "int4_moe_memory_scale",
                    "int4_moe_compute_scale",
                    "moe_token_scale",
                    "int8_moe_token_scale",
                    "int4_moe_token_scale",
                    "attention_prefill_scale",
                    "residuals"});
  CostModelParams p;
  p.name = o.get_string_or("name", "unnamed");
  p.source = o.get_string_or("source", "");
  p.calibrated = o.get_bool_or("calibrated", false);
  constexpr double kMinEff = 0.01;
  p.moe_memory_efficiency = o.get_double("moe_memory_efficiency", kMinEff, 1.0);
  p.moe_compute_efficiency = o.get_double("moe_compute_efficiency", kMinEff, 1.0);
  p.dense_memory_efficiency = o.get_double("dense_memory_efficiency", kMinEff, 1.0);
  p.dense_compute_efficiency = o.get_double("dense_compute_efficiency", kMinEff, 1.0);
  p.attention_memory_efficiency = o.get_double("attention_memory_efficiency", kMinEff, 1.0);
  p.attention_compute_efficiency = o.get_double("attention_compute_efficiency", kMinEff, 1.0);
  p.per_layer_overhead_s = o.get_double("per_layer_overhead_us", 0.0, 1e6) * 1e-6;
  p.step_overhead_s = o.get_double("step_overhead_us", 0.0, 1e7) * 1e-6;
  p.h2d_bandwidth_scale = o.get_double_or("h2d_bandwidth_scale", 1.0, 0.01, 2.0);
  // Optional (older files lack it): the per-copy latency relative to the GPU profile's.
  p.h2d_copy_latency_scale = o.get_double_or("h2d_copy_latency_scale", 1.0, 0.0, 100.0);
  // Optional (older files lack them): the MoE kernel's efficiency on quantized experts relative to bf16.
  p.int8.memory = o.get_double_or("int8_moe_memory_scale", p.int8.memory, 0.05, 2.0);
  p.int8.compute = o.get_double_or("int8_moe_compute_scale", p.int8.compute, 0.05, 2.0);
  p.int4.memory = o.get_double_or("int4_moe_memory_scale", p.int4.memory, 0.05, 2.0);
  p.int4.compute = o.get_double_or("int4_moe_compute_scale", p.int4.compute, 0.05, 2.0);
  // Optional: the token-scale tables, [{"tokens": t, "scale": f}, ...].
  p.moe_token_scale = token_scale_table(o, "moe_token_scale");
  p.int8.token_scale = token_scale_table(o, "int8_moe_token_scale");
  p.int4.token_scale = token_scale_table(o, "int4_moe_token_scale");
  p.attention_prefill_scale = token_scale_table(o, "attention_prefill_scale");
  // Optional: a calibration's residuals per phase, {"moe": {"samples": n, "median_abs_rel_error": x,
  // "p90_abs_rel_error": y}, ...}; informative only.
  if (o.has("residuals")) {
    const JsonObject r = o.get_object("residuals");
    r.reject_unknown({"attention", "moe", "dense", "step", "copy"});
    for (const char* phase : {"attention", "moe", "dense", "step", "copy"}) {
      if (!r.has(phase)) continue;
      const JsonObject e = r.get_object(phase);
      e.reject_unknown({"samples", "median_abs_rel_error", "p90_abs_rel_error"});
      CostModelResidual res;
      res.phase = phase;
      res.samples = e.get_uint("samples", 1, std::uint64_t{1} << 53);
      res.median_abs_rel_error = e.get_double("median_abs_rel_error", 0.0, 1e9);
      res.p90_abs_rel_error = e.get_double("p90_abs_rel_error", 0.0, 1e9);
      if (res.p90_abs_rel_error < res.median_abs_rel_error)
        throw ConfigError(
            e.path() + ".p90_abs_rel_error", std::to_string(res.p90_abs_rel_error),
            "must be >= median_abs_rel_error (" + std::to_string(res.median_abs_rel_error) + ")");
      p.residuals.push_back(res);
    }
  }
  return p;
}

CostModelParams find_cost_model(const std::string& name_or_path) {
  if (name_or_path.size() > 5 && name_or_path.ends_with(".json"))
    return parse_cost_model(read_text_file(name_or_path, "--cost-model", kMaxConfigFileBytes), name_or_path);
  for (const EmbeddedFile& f : embedded_cost_model_files()) {
    CostModelParams p = parse_cost_model(f.text, "cost model file " + std::string(f.name));
    if (p.name == name_or_path) return p;
  }
  throw ConfigError("--cost-model", quote_text(name_or_path),
                    fmt::format("unknown cost model (built in: {}; or a .json path)",
                                fmt::join(builtin_cost_model_names(), ", ")));
}

const std::vector<std::string>& builtin_cost_model_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const EmbeddedFile& f : embedded_cost_model_files())
      v.push_back(parse_cost_model(f.text, "cost model file " + std::string(f.name)).name);
    return v;
  }();
  return names;
}

std::string cost_model_to_json(const CostModelParams& p) {
  nlohmann::ordered_json j;
  j["name"] = p.name;
  j["calibrated"] = p.calibrated;
  j["source"] = p.source;
  j["moe_memory_efficiency"] = p.moe_memory_efficiency;
  j["moe_compute_efficiency"] = p.moe_compute_efficiency;
  j["dense_memory_efficiency"] = p.dense_memory_efficiency;
  j["dense_compute_efficiency"] = p.dense_compute_efficiency;
  j["attention_memory_efficiency"] = p.attention_memory_efficiency;
  j["attention_compute_efficiency"] = p.attention_compute_efficiency;
  j["per_layer_overhead_us"] = p.per_layer_overhead_s * 1e6;
  j["step_overhead_us"] = p.step_overhead_s * 1e6;
  j["h2d_bandwidth_scale"] = p.h2d_bandwidth_scale;
  j["h2d_copy_latency_scale"] = p.h2d_copy_latency_scale;
  j["int8_moe_memory_scale"] = p.int8.memory;
  j["int8_moe_compute_scale"] = p.int8.compute;
  j["int4_moe_memory_scale"] = p.int4.memory;
  j["int4_moe_compute_scale"] = p.int4.compute;
  auto table = [](const std::vector<CostModelParams::TokenScale>& t) {
    nlohmann::ordered_json a = nlohmann::ordered_json::array();
    for (const CostModelParams::TokenScale& k : t) a.push_back({{"tokens", k.tokens}, {"scale", k.scale}});
    return a;
  };
  if (!p.moe_token_scale.empty()) j["moe_token_scale"] = table(p.moe_token_scale);
  if (!p.int8.token_scale.empty()) j["int8_moe_token_scale"] = table(p.int8.token_scale);
  if (!p.int4.token_scale.empty()) j["int4_moe_token_scale"] = table(p.int4.token_scale);
  if (!p.attention_prefill_scale.empty()) j["attention_prefill_scale"] = table(p.attention_prefill_scale);
  if (!p.residuals.empty()) {
    nlohmann::ordered_json r = nlohmann::ordered_json::object();
    for (const CostModelResidual& e : p.residuals)
      r[e.phase] = {{"samples", e.samples},
                    {"median_abs_rel_error", e.median_abs_rel_error},
                    {"p90_abs_rel_error", e.p90_abs_rel_error}};
    j["residuals"] = r;
  }
  return j.dump(2) + "\n";
}

}  // namespace amoeba::engine
