// GPU profiles and cost-model parameters; see gpu.hpp.
#include "engine/gpu.hpp"

#include <nlohmann/json.hpp>

#include "amoeba/core/errors.hpp"
#include "engine/embedded_data.hpp"
#include "engine/json_fields.hpp"

namespace amoeba::engine {

GpuProfile parse_gpu(std::string_view json_text, const std::string& what) {
  const nlohmann::json j = parse_json_text(json_text, what);
  const JsonObject o(j, what);
  o.reject_unknown({"name", "description", "memory_mib", "hbm_bandwidth_gbs", "bf16_tflops",
                    "h2d_bandwidth_gbs", "h2d_copy_latency_us", "cuda_context_mib", "sources"});
  GpuProfile g;
  g.name = o.get_string("name");
  if (g.name.empty()) throw ConfigError(what + ".name", "\"\"", "must not be empty");
  g.description = o.get_string_or("description", "");
  g.memory_bytes = o.get_uint("memory_mib", 64, 1u << 24) << 20;
  g.hbm_bandwidth = o.get_double("hbm_bandwidth_gbs", 1.0, 1e6) * 1e9;
  g.bf16_flops = o.get_double("bf16_tflops", 0.1, 1e6) * 1e12;
  g.h2d_bandwidth = o.get_double("h2d_bandwidth_gbs", 0.1, 1e4) * 1e9;
  g.h2d_copy_latency_s = o.get_double("h2d_copy_latency_us", 0.0, 1e6) * 1e-6;
  g.cuda_context_bytes = o.get_uint_or("cuda_context_mib", 500, 0, 1u << 20) << 20;
  if (o.has("sources")) {
    const JsonObject s = o.get_object("sources");
    for (auto it = s.raw().begin(); it != s.raw().end(); ++it)
      g.sources.emplace_back(it.key(), s.get_string(it.key()));
  }
  return g;
}

const std::vector<GpuProfile>& gpu_catalog() {
  static const std::vector<GpuProfile> catalog = [] {
    std::vector<GpuProfile> v;
    for (const EmbeddedFile& f : embedded_gpu_files())
      v.push_back(parse_gpu(f.text, "gpu file " + std::string(f.name)));
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

CostModelParams parse_cost_model(std::string_view json_text, const std::string& what) {
  const nlohmann::json j = parse_json_text(json_text, what);
  const JsonObject o(j, what);
  if (j.is_object() && j.contains("copies_per_expert"))
    throw ConfigError(
        what + ".copies_per_expert", "(present)",
        "is no longer a cost-model parameter: copy calls come from the loader's plan (a restore "
        "is 3, a buffered expert 1); remove the key");
  o.reject_unknown({"name", "calibrated", "source", "moe_memory_efficiency", "moe_compute_efficiency",
                    "dense_memory_efficiency", "dense_compute_efficiency", "attention_memory_efficiency",
                    "attention_compute_efficiency", "per_layer_overhead_us", "step_overhead_us",
                    "h2d_bandwidth_scale"});
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
                    "unknown cost model (built in: default, or a .json path)");
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
  return j.dump(2) + "\n";
}

}  // namespace amoeba::engine
