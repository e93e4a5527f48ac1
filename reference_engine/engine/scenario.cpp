// Scenario parsing; see scenario.hpp.
#include "engine/scenario.hpp"

#include <cmath>
#include <sstream>

#include <nlohmann/json.hpp>

#include "amoeba/core/errors.hpp"
#include "engine/embedded_data.hpp"
#include "engine/json_fields.hpp"
#include "engine/policy_dispatch.hpp"

namespace amoeba::engine {

std::uint32_t Scenario::fixed_offload_for(std::uint32_t experts) const noexcept {
  if (fixed_offload) return std::min(*fixed_offload, experts);
  return static_cast<std::uint32_t>(std::lround(0.1 * experts));
}

Scenario parse_scenario(std::string_view json_text, const std::string& what, Scenario s) {
  const nlohmann::json j = parse_json_text(json_text, what);
  const JsonObject o(j, "config");
  o.reject_unknown({"backend", "model", "weights", "gpu", "cost_model", "memory_cap_gib", "usable_fraction",
                    "workload", "policies", "engine", "experts", "routing", "predictor", "expert_precision",
                    "moe_kernel", "runs", "tp"});
  s.backend = o.get_string_or("backend", s.backend);
  s.tp = static_cast<std::uint32_t>(o.get_uint_or("tp", s.tp, ranges::kTp.min, ranges::kTp.max));
  if (o.has("model") && o.has("weights"))
    throw ConfigError("config.model", quote_json(o.raw().at("model")),
                      "must not be given with config.weights: the checkpoint's config.json is the model");
  if (o.has("model")) {
    s.model = o.get_string("model");
    s.weights.clear();  // a later layer's model replaces an earlier layer's checkpoint
  }
  if (o.has("weights")) {
    s.weights = o.get_string("weights");
    if (s.weights.empty())
      throw ConfigError("config.weights", "\"\"",
                        "must name a checkpoint directory (leave the key out for none)");
  }
  if (o.has("gpu")) {
    s.gpu = o.get_string("gpu");
    s.gpu_given = true;
  }
  s.cost_model = o.get_string_or("cost_model", s.cost_model);
  if (o.has("memory_cap_gib")) {
    const double cap = o.get_double("memory_cap_gib", 0.0, ranges::kMemoryCapGib.max);
    if (cap != 0 && cap < ranges::kMemoryCapGib.min)
      throw_config_error("config.memory_cap_gib", cap, memory_cap_rule());
    s.memory.memory_cap_bytes = memory_cap_bytes(cap);
  }
  s.memory.usable_fraction = o.get_double_or("usable_fraction", s.memory.usable_fraction,
                                             ranges::kUsableFraction.min, ranges::kUsableFraction.max);
  if (o.has("workload")) {
    const JsonObject w = o.get_object("workload");
    w.reject_unknown({"rate", "burstiness", "requests", "seed", "trace"});
    s.rate = w.get_double_or("rate", s.rate, ranges::kRate.min, ranges::kRate.max);
    s.burstiness =
        w.get_double_or("burstiness", s.burstiness, ranges::kBurstiness.min, ranges::kBurstiness.max);
    s.requests = w.get_uint_or("requests", s.requests, ranges::kRequests.min, ranges::kRequests.max);
    s.seed = w.get_uint_or("seed", s.seed, ranges::kSeed.min, ranges::kSeed.max);
    s.trace = w.get_string_or("trace", s.trace);
  }
  if (o.has("policies")) {
    const nlohmann::json& p = o.raw().at("policies");
    if (!p.is_array() || p.empty())
      throw ConfigError("config.policies", quote_json(p), "must be a non-empty array");
    s.policies.clear();
    for (std::size_t i = 0; i < p.size(); ++i) {
      if (!p[i].is_string())
        throw ConfigError("config.policies[" + std::to_string(i) + "]", quote_json(p[i]), "must be a string");
      s.policies.push_back(p[i].get<std::string>());
    }
  }
  if (o.has("engine")) {
    const JsonObject e = o.get_object("engine");
    e.reject_unknown({"max_num_batched_tokens", "max_num_seqs", "max_model_len"});
    s.scheduler.max_num_batched_tokens = static_cast<std::uint32_t>(
        e.get_uint_or("max_num_batched_tokens", s.scheduler.max_num_batched_tokens,
                      ranges::kMaxNumBatchedTokens.min, ranges::kMaxNumBatchedTokens.max));
    s.scheduler.max_num_seqs = static_cast<std::uint32_t>(e.get_uint_or(
        "max_num_seqs", s.scheduler.max_num_seqs, ranges::kMaxNumSeqs.min, ranges::kMaxNumSeqs.max));
    s.scheduler.max_model_len = static_cast<std::uint32_t>(e.get_uint_or(
        "max_model_len", s.scheduler.max_model_len, ranges::kMaxModelLen.min, ranges::kMaxModelLen.max));
  }
  if (o.has("experts")) {
    const JsonObject e = o.get_object("experts");
    e.reject_unknown(
        {"expert_offload_limit", "fixed_offload", "evict_below", "restore_above", "max_restores"});
    s.expert_offload_limit = static_cast<std::uint32_t>(e.get_uint_or(
        "expert_offload_limit", s.expert_offload_limit, ranges::kOffload.min, ranges::kOffload.max));
    if (!e.is_null("fixed_offload"))
      s.fixed_offload =
          static_cast<std::uint32_t>(e.get_uint("fixed_offload", ranges::kOffload.min, ranges::kOffload.max));
    s.evict_below =
        e.get_uint_or("evict_below", s.evict_below, ranges::kThreshold.min, ranges::kThreshold.max);
    s.restore_above =
        e.get_uint_or("restore_above", s.restore_above, ranges::kThreshold.min, ranges::kThreshold.max);
    s.max_restores = static_cast<std::uint32_t>(
        e.get_uint_or("max_restores", s.max_restores, ranges::kThreshold.min, ranges::kThreshold.max));
  }
  if (o.has("routing")) {
    const JsonObject r = o.get_object("routing");
    r.reject_unknown({"source", "ranking", "skew", "cross_layer_correlation", "locality", "temporal_sigma",
                      "drift", "calibration_tokens", "temporal_period"});
    if (r.has("source")) {
      s.routing_source = r.get_string("source");
      s.routing_given = true;
    }
    s.ranking = r.get_string_or("ranking", s.ranking);
    s.routing.skew = r.get_double_or("skew", s.routing.skew, ranges::kSkew.min, ranges::kSkew.max);
    s.routing.cross_layer_correlation = r.get_double_or(
        "cross_layer_correlation", s.routing.cross_layer_correlation, ranges::kUnit.min, ranges::kUnit.max);
    s.routing.locality =
        r.get_double_or("locality", s.routing.locality, ranges::kUnit.min, ranges::kUnit.max);
    s.routing.temporal_sigma = r.get_double_or("temporal_sigma", s.routing.temporal_sigma,
                                               ranges::kTemporalSigma.min, ranges::kTemporalSigma.max);
    s.routing.drift = r.get_double_or("drift", s.routing.drift, ranges::kUnit.min, ranges::kUnit.max);
    s.routing.calibration_tokens =
        r.get_uint_or("calibration_tokens", s.routing.calibration_tokens, ranges::kCalibrationTokens.min,
                      ranges::kCalibrationTokens.max);
    s.routing.temporal_period =
        static_cast<std::uint32_t>(r.get_uint_or("temporal_period", s.routing.temporal_period,
                                                 ranges::kTemporalPeriod.min, ranges::kTemporalPeriod.max));
  }
  if (o.has("predictor")) {
    const JsonObject p = o.get_object("predictor");
    p.reject_unknown({"kind", "accuracy"});
    if (p.has("kind")) {
      const std::string k = p.get_string("kind");
      try {
        s.predictor.kind = predictor_from_string(k);
      } catch (const ConfigError& e) {
        throw ConfigError("config.predictor.kind", quote_text(k), e.rule());
      }
    }
    s.predictor.accuracy =
        p.get_double_or("accuracy", s.predictor.accuracy, ranges::kUnit.min, ranges::kUnit.max);
  }
  if (o.has("expert_precision"))
    s.expert_precision =
        expert_precision_from_string(o.get_string("expert_precision"), "config.expert_precision");
  if (o.has("moe_kernel"))
    s.moe_kernel = moe_kernel_from_string(o.get_string("moe_kernel"), "config.moe_kernel");
  if (o.has("runs")) {
    const nlohmann::json& r = o.raw().at("runs");
    if (!r.is_array() || r.empty()) throw ConfigError("config.runs", r.dump(), "must be a non-empty array");
    s.runs.clear();
    for (std::size_t i = 0; i < r.size(); ++i) {
      const std::string path = "config.runs[" + std::to_string(i) + "]";
      const JsonObject x(r[i], path);
      x.reject_unknown({"label", "policy", "moe_kernel"});
      RunVariant v;
      v.policy = x.get_string("policy");
      v.label = x.get_string_or("label", v.policy);
      if (v.label.empty() || v.label.size() > 40 || v.label.find_first_of(",\"\n\r") != std::string::npos)
        throw ConfigError(path + ".label", v.label,
                          "must be 1 to 40 characters without commas, quotes or newlines");
      if (x.has("moe_kernel"))
        v.moe_kernel = moe_kernel_from_string(x.get_string("moe_kernel"), path + ".moe_kernel");
      for (const RunVariant& w : s.runs)
        if (w.label == v.label) throw ConfigError(path + ".label", v.label, "must be unique among the runs");
      s.runs.push_back(std::move(v));
    }
  }
  return s;
}

std::vector<RunVariant> scenario_runs(const Scenario& s) {
  if (!s.runs.empty()) return s.runs;
  std::vector<RunVariant> v;
  for (const std::string& p : s.policies) v.push_back(RunVariant{p, p, std::nullopt});
  return v;
}

NamedScenario parse_named_scenario(std::string_view json_text, const std::string& what) {
  const nlohmann::json j = parse_json_text(json_text, what);
  const JsonObject o(j, what);
  o.reject_unknown({"name", "description", "paper", "choices", "sweep", "config"});
  NamedScenario n;
  n.name = o.get_string("name");
  if (n.name.empty()) throw ConfigError(what + ".name", "\"\"", "must not be empty");
  n.description = o.get_string_or("description", "");
  n.paper = o.get_string_or("paper", "");
  n.choices = o.get_string_or("choices", "");
  if (o.has("sweep")) {
    const JsonObject w = o.get_object("sweep");
    w.reject_unknown({"rates"});
    if (!w.has("rates")) throw ConfigError(what + ".sweep.rates", "(missing)", "is required in a sweep");
    const nlohmann::json& r = w.raw().at("rates");
    if (!r.is_array()) throw ConfigError(what + ".sweep.rates", r.dump(), "must be an array of numbers");
    for (const nlohmann::json& x : r) {
      if (!x.is_number() || !(x.get<double>() > 0) || !std::isfinite(x.get<double>()))
        throw ConfigError(what + ".sweep.rates", x.dump(), "each rate must be a finite number > 0");
      n.sweep_rates.push_back(x.get<double>());
    }
  }
  (void)o.get_object("config");
  n.config_json = j.at("config").dump();
  (void)parse_scenario(n.config_json, what + ".config");  // validates the config now, not at first use
  return n;
}

const std::vector<NamedScenario>& scenario_catalog() {
  static const std::vector<NamedScenario> catalog = [] {
    std::vector<NamedScenario> v;
    for (const EmbeddedFile& f : embedded_scenario_files())
      v.push_back(parse_named_scenario(f.text, "scenario file " + std::string(f.name)));
    return v;
  }();
  return catalog;
}

const NamedScenario& find_scenario(const std::string& name) {
  std::string known;
  for (const NamedScenario& n : scenario_catalog()) {
    if (n.name == name) return n;
    known += (known.empty() ? "" : ", ") + n.name;
  }
  throw ConfigError("--scenario", name, "unknown scenario (known: " + known + ")");
}

Scenario apply_named_scenario(const NamedScenario& n, Scenario base) {
  Scenario s = parse_scenario(n.config_json, "scenario " + n.name, std::move(base));
  s.name = n.name;
  return s;
}

void validate_scenario(const Scenario& s) {
  (void)find_backend(s.backend);
  if (s.routing_source.empty())
    throw ConfigError("--routing", "\"\"",
                      "must be synthetic, model or a routing record file (amoeba.routing)");
  check_routing_source(s);
  for (const std::string& p : s.policies) (void)find_policy(p);
  auto real = [](const char* field, double v, RealRange r) {
    if (!(v >= r.min && v <= r.max))  // NaN fails too
      throw_config_error(field, v, range_rule(r));
  };
  real("--rate", s.rate, ranges::kRate);
  real("--burstiness", s.burstiness, ranges::kBurstiness);
  if (s.requests < ranges::kRequests.min || s.requests > ranges::kRequests.max)
    throw_config_error("--requests", s.requests, range_rule(ranges::kRequests));
  real("--usable-fraction", s.memory.usable_fraction, ranges::kUsableFraction);
  if (s.tp < ranges::kTp.min || s.tp > ranges::kTp.max)
    throw_config_error("--tp", s.tp, range_rule(ranges::kTp));
  if (s.tp > 1 && find_backend(s.backend).kind != BackendKind::kCuda)
    throw_config_error(
        "--tp", s.tp,
        "tensor parallelism over GPUs runs on --backend cuda; the simulator prices several GPUs "
        "through a GPU profile of several (--gpu, amoeba gpus)");
  for (const RunVariant& v : s.runs) {
    try {
      (void)find_policy(v.policy);
    } catch (const ConfigError& e) {
      throw ConfigError("config.runs (" + v.label + ").policy", v.policy, e.rule());
    }
  }
  // The budget bounds how many steps one prompt's prefill takes; blame the flag a user lowers.
  if (s.scheduler.max_model_len > s.scheduler.max_num_batched_tokens * 64ull)
    throw_config_error(
        "--max-num-batched-tokens", s.scheduler.max_num_batched_tokens,
        "must be >= max_model_len / 64 = " + std::to_string((s.scheduler.max_model_len + 63) / 64) +
            " (max_model_len " + std::to_string(s.scheduler.max_model_len) + ")");
}

void apply_backend_defaults(Scenario& s) {
  const BackendEntry& b = find_backend(s.backend);
  if (!s.gpu_given) s.gpu = std::string(b.gpu);
  if (!s.routing_given) s.routing_source = std::string(b.routing);
}

void check_routing_source(const Scenario& s) {
  if (s.routing_source == "model" && find_backend(s.backend).simulated)
    throw ConfigError("--routing", "model",
                      "the simulator (--backend " + s.backend +
                          ") has no router: use synthetic or a routing record file (model is the GPU's "
                          "router, --backend cuda)");
}

std::string model_label(const Scenario& s) {
  return s.weights.empty() ? s.model : "checkpoint " + s.weights;
}

std::string range_rule(RealRange r) {
  std::ostringstream os;
  os << "must be a finite number in [" << r.min << ", " << r.max << "]";
  return os.str();
}
std::string range_rule(CountRange r) {
  return "must be in [" + std::to_string(r.min) + ", " + std::to_string(r.max) + "]";
}
std::string memory_cap_rule() {
  std::ostringstream os;
  os << "must be 0 (no cap) or in [" << ranges::kMemoryCapGib.min << ", " << ranges::kMemoryCapGib.max << "]";
  return os.str();
}
std::uint64_t memory_cap_bytes(double gib) {
  return static_cast<std::uint64_t>(gib * double(1ull << 30));
}
double memory_gib(std::uint64_t bytes) {
  return double(bytes) / double(1ull << 30);
}

std::string scenario_to_json(const Scenario& s, int indent) {
  nlohmann::ordered_json j;
  j["backend"] = s.backend;
  if (s.tp != 1) j["tp"] = s.tp;  // absent: one GPU (files written before tensor parallelism read alike)
  if (s.weights.empty())
    j["model"] = s.model;
  else  // the checkpoint is the model (a config may not name both)
    j["weights"] = s.weights;
  j["gpu"] = s.gpu;
  j["cost_model"] = s.cost_model;
  j["memory_cap_gib"] = memory_gib(s.memory.memory_cap_bytes);
  j["usable_fraction"] = s.memory.usable_fraction;
  if (s.trace.empty())
    j["workload"] = {{"rate", s.rate},
                     {"burstiness", s.burstiness},
                     {"requests", s.requests},
                     {"seed", s.seed},
                     {"trace", s.trace}};
  else  // the generator's settings did not run; the report says what the trace held
    j["workload"] = {{"seed", s.seed}, {"trace", s.trace}};
  if (!s.policies.empty()) j["policies"] = s.policies;  // absent = every policy
  j["engine"] = {{"max_num_batched_tokens", s.scheduler.max_num_batched_tokens},
                 {"max_num_seqs", s.scheduler.max_num_seqs},
                 {"max_model_len", s.scheduler.max_model_len}};
  nlohmann::ordered_json ex;
  ex["expert_offload_limit"] = s.expert_offload_limit;
  if (s.fixed_offload)
    ex["fixed_offload"] = *s.fixed_offload;
  else
    ex["fixed_offload"] = nullptr;
  ex["evict_below"] = s.evict_below;
  ex["restore_above"] = s.restore_above;
  ex["max_restores"] = s.max_restores;
  j["experts"] = ex;
  j["routing"] = {{"source", s.routing_source},
                  {"ranking", s.ranking},
                  {"skew", s.routing.skew},
                  {"cross_layer_correlation", s.routing.cross_layer_correlation},
                  {"locality", s.routing.locality},
                  {"temporal_sigma", s.routing.temporal_sigma},
                  {"drift", s.routing.drift},
                  {"calibration_tokens", s.routing.calibration_tokens},
                  {"temporal_period", s.routing.temporal_period}};
  j["predictor"] = {{"kind", to_string(s.predictor.kind)}, {"accuracy", s.predictor.accuracy}};
  j["expert_precision"] = to_string(s.expert_precision);
  j["moe_kernel"] = to_string(s.moe_kernel);
  if (!s.runs.empty()) {
    nlohmann::ordered_json runs = nlohmann::ordered_json::array();
    for (const RunVariant& v : s.runs) {
      nlohmann::ordered_json x;
      x["label"] = v.label;
      x["policy"] = v.policy;
      if (v.moe_kernel) x["moe_kernel"] = to_string(*v.moe_kernel);
      runs.push_back(x);
    }
    j["runs"] = runs;
  }
  return j.dump(indent);
}

}  // namespace amoeba::engine
