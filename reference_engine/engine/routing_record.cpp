// Routing records; see routing_record.hpp for the format.
#include "engine/routing_record.hpp"

#include <memory>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "amoeba/core/errors.hpp"
#include "engine/json_fields.hpp"

namespace amoeba::engine {

RoutingRecorder::RoutingRecorder(RoutingRecordHeader header) : header_(std::move(header)) {
  nlohmann::ordered_json h;
  h["format"] = "amoeba.routing";
  h["version"] = 1;
  h["model"] = header_.model;
  h["moe_layers"] = header_.moe_layers;
  h["experts"] = header_.experts;
  h["top_k"] = header_.top_k;
  h["backend"] = header_.backend;
  h["routing"] = header_.routing;
  text_ = h.dump() + "\n";
}

void RoutingRecorder::add(const StepBatch& batch, const StepResult& result) {
  text_ += fmt::format("{{\"step\":{},\"tokens\":{},\"experts\":[", steps_, batch.tokens);
  for (std::uint32_t l = 0; l < result.routed_layers(); ++l) {
    text_ += l ? ",[" : "[";
    bool first = true;
    for (std::uint32_t e : result.routed_at(l)) {
      if (!first) text_ += ',';
      text_ += std::to_string(e);
      first = false;
    }
    text_ += "]";
  }
  text_ += "]}\n";
  ++steps_;
}

namespace {

// One per-layer array of arrays of unsigned integers (experts or counts); `ascending`: strictly increasing.
std::vector<std::vector<std::uint32_t>> layer_arrays(const nlohmann::json& j, const char* key,
                                                     const std::string& at, std::uint32_t layers,
                                                     std::uint64_t lo, std::uint64_t hi, bool ascending) {
  const auto it = j.find(key);
  const std::string field = at + "." + key;
  if (!it->is_array() || it->size() != layers)
    throw ConfigError(field,
                      it->is_array() ? fmt::format("{} arrays", it->size()) : std::string(it->type_name()),
                      fmt::format("must be an array of {} arrays, one per MoE layer", layers));
  std::vector<std::vector<std::uint32_t>> out(layers);
  for (std::uint32_t l = 0; l < layers; ++l) {
    const nlohmann::json& a = (*it)[l];
    const std::string fl = fmt::format("{}[{}]", field, l);
    if (!a.is_array()) throw ConfigError(fl, a.type_name(), "must be an array");
    out[l].reserve(a.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      const nlohmann::json& v = a[i];
      if (!v.is_number_unsigned() || v.get<std::uint64_t>() < lo || v.get<std::uint64_t>() > hi)
        throw ConfigError(fmt::format("{}[{}]", fl, i),
                          v.is_number() ? quote_json(v) : std::string(v.type_name()),
                          fmt::format("must be an integer in [{}, {}]", lo, hi));
      const auto x = static_cast<std::uint32_t>(v.get<std::uint64_t>());
      if (ascending && !out[l].empty() && x <= out[l].back())
        throw_config_error(fmt::format("{}[{}]", fl, i), x, "experts must be listed ascending, each once");
      out[l].push_back(x);
    }
  }
  return out;
}

}  // namespace

RoutingRecord parse_routing_record(std::string_view text, const std::string& what) {
  RoutingRecord r;
  std::size_t line_no = 0, pos = 0;
  bool have_header = false;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const std::string at = fmt::format("{}:{}", what, line_no);
    const nlohmann::json j = parse_json_text(line, at);
    if (!j.is_object()) throw ConfigError(at, j.type_name(), "each line must be a JSON object");
    const JsonObject o(j, at);
    if (!have_header) {
      if (o.get_string("format") != "amoeba.routing")
        throw ConfigError(at + ".format", quote_json(j.at("format")), "must be \"amoeba.routing\"");
      (void)o.get_uint("version", 1, 1);  // the only version
      RoutingRecordHeader& h = r.header;
      h.model = o.get_string("model");
      h.moe_layers = static_cast<std::uint32_t>(o.get_uint("moe_layers", 1, 1u << 16));
      h.experts = static_cast<std::uint32_t>(o.get_uint("experts", 1, 1u << 20));
      h.top_k = static_cast<std::uint32_t>(o.get_uint("top_k", 1, h.experts));
      h.backend = o.get_string("backend");
      h.routing = o.get_string("routing");
      have_header = true;
      continue;
    }
    const std::uint64_t step = o.get_uint("step", 0, ~std::uint64_t{0} >> 1);
    if (step != r.steps.size())
      throw_config_error(at + ".step", step,
                         fmt::format("steps must count up from 0 (expected {})", r.steps.size()));
    r.tokens.push_back(o.get_uint("tokens", 1, ~std::uint32_t{0}));
    if (!j.contains("experts")) throw_config_error(at + ".experts", "(missing)", "is required");
    r.steps.push_back(layer_arrays(j, "experts", at, r.header.moe_layers, 0, r.header.experts - 1, true));
    if (j.contains("counts")) {
      if (r.counts.size() != r.steps.size() - 1)
        throw_config_error(at + ".counts", "(present)", "either every step has counts or none has");
      auto c = layer_arrays(j, "counts", at, r.header.moe_layers, 1, ~std::uint32_t{0}, false);
      for (std::uint32_t l = 0; l < r.header.moe_layers; ++l)
        if (c[l].size() != r.steps.back()[l].size())
          throw_config_error(
              fmt::format("{}.counts[{}]", at, l), c[l].size(),
              fmt::format("must have one count per listed expert ({})", r.steps.back()[l].size()));
      r.counts.push_back(std::move(c));
    } else if (!r.counts.empty()) {
      throw_config_error(at + ".counts", "(missing)", "either every step has counts or none has");
    }
  }
  if (!have_header) throw_config_error(what, "(empty)", "must start with an amoeba.routing header line");
  if (r.steps.empty()) throw_config_error(what, "(no steps)", "must record at least one step");
  return r;
}

RoutingRecord read_routing_record(const std::string& path) {
  return parse_routing_record(read_text_file(path, "--routing"), path);
}

std::vector<std::vector<double>> routing_counts(const RoutingRecord& r) {
  std::vector<std::vector<double>> v(r.header.moe_layers, std::vector<double>(r.header.experts, 0.0));
  for (std::size_t s = 0; s < r.steps.size(); ++s)
    for (std::uint32_t l = 0; l < r.header.moe_layers; ++l)
      for (std::size_t i = 0; i < r.steps[s][l].size(); ++i)
        v[l][r.steps[s][l][i]] += r.counts.empty() ? 1.0 : double(r.counts[s][l][i]);
  return v;
}

std::string expert_stats_json(const RoutingRecord& r, const std::string& source) {
  nlohmann::ordered_json j;
  j["format"] = "amoeba.expert_stats";
  j["version"] = 1;
  j["kind"] = "count";
  j["layers"] = r.header.moe_layers;
  j["experts"] = r.header.experts;
  j["source"] = fmt::format("{}: {} steps of {} ({} routing on {}); {}", source, r.steps.size(),
                            r.header.model, r.header.routing, r.header.backend,
                            r.counts.empty() ? "steps in which each expert was routed to" : "tokens routed");
  nlohmann::json values = nlohmann::json::array();
  for (const auto& layer : routing_counts(r)) {
    nlohmann::json row = nlohmann::json::array();
    for (double c : layer) row.push_back(static_cast<std::uint64_t>(c));
    values.push_back(std::move(row));
  }
  j["values"] = std::move(values);
  return j.dump() + "\n";
}

void check_record_shape(const RoutingRecord& r, std::uint32_t moe_layers, std::uint32_t experts,
                        const std::string& what) {
  if (r.header.moe_layers != moe_layers || r.header.experts != experts)
    throw ConfigError(
        what,
        fmt::format("{} x {} experts ({})", r.header.moe_layers, r.header.experts,
                    quote_text(r.header.model)),
        fmt::format("must be recorded for the model's {} MoE layers x {} experts", moe_layers, experts));
}

std::unique_ptr<RecordedRouting> replay(const RoutingRecord& r, std::uint32_t moe_layers,
                                        std::uint32_t experts, std::uint32_t top_k, const std::string& what) {
  check_record_shape(r, moe_layers, experts, what);
  return std::make_unique<RecordedRouting>(moe_layers, experts, top_k, r.steps, /*wrap=*/true);
}

}  // namespace amoeba::engine
