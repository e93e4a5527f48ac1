// Reads ExpertRanker statistics from JSON (needs nlohmann-json; kept out of expert_ranker.hpp so the core
// needs no JSON library). Link nlohmann_json::nlohmann_json to use it.
//
// Format (every field required unless marked):
//   {
//     "format": "amoeba.expert_stats",      // exactly this string
//     "version": 1,                          // exactly 1
//     "kind": "probability",                 // "probability" (values in [0, 1]) or "count" (integers >= 0)
//     "layers": 2, "experts": 4,             // optional; when given they must match "values"
//     "values": [[0.4, 0.3, 0.2, 0.1],       // values[layer][expert], every layer the same length
//                [0.1, 0.2, 0.3, 0.4]]
//   }
// Counts become per-layer shares as in the CSV format (expert_ranker.hpp). Each broken rule throws
// ConfigError naming the field (e.g. "stats.json.values[1][3]"), the value and the rule; malformed JSON names
// the byte offset.
#pragma once

#include <cstdint>
#include <fstream>
#include <istream>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "amoeba/core/errors.hpp"
#include "amoeba/expert/expert_ranker.hpp"

namespace amoeba {

inline ExpertRanker expert_ranker_from_json(const nlohmann::json& j, std::string_view source = "json") {
  const std::string s(source);
  if (!j.is_object()) throw_config_error(s, j.type_name(), "must be a JSON object");
  auto field = [&](const char* name) -> const nlohmann::json& {
    const auto it = j.find(name);
    if (it == j.end()) throw_config_error(s + "." + name, "(missing)", "is required");
    return *it;
  };
  const auto& fmt = field("format");
  if (!fmt.is_string() || fmt.get<std::string>() != "amoeba.expert_stats")
    throw_config_error(s + ".format", fmt.dump(), "must be \"amoeba.expert_stats\"");
  const auto& ver = field("version");
  if (!ver.is_number_integer() || ver.get<std::int64_t>() != 1)
    throw_config_error(s + ".version", ver.dump(), "must be 1 (the only version this reader knows)");
  const auto& kind_j = field("kind");
  if (!kind_j.is_string() ||
      (kind_j.get<std::string>() != "probability" && kind_j.get<std::string>() != "count"))
    throw_config_error(s + ".kind", kind_j.dump(), "must be \"probability\" or \"count\"");
  const bool counts = kind_j.get<std::string>() == "count";
  const auto& values = field("values");
  if (!values.is_array() || values.empty())
    throw_config_error(s + ".values", values.dump().substr(0, 40), "must be a non-empty array of layers");
  if (values.size() >= kMaxLayers)
    throw_config_error(s + ".values", values.size(), "must have fewer than 2^24 layers");
  const auto& first = values[0];
  if (!first.is_array() || first.empty() || first.size() >= kMaxExpertsPerLayer)
    throw_config_error(s + ".values[0]", first.dump().substr(0, 40),
                       "must be a non-empty array of fewer than 2^24 experts");
  const auto L = static_cast<std::uint32_t>(values.size());
  const auto E = static_cast<std::uint32_t>(first.size());
  for (const char* dim : {"layers", "experts"}) {
    const auto it = j.find(dim);
    if (it == j.end()) continue;
    const std::uint32_t want = std::string_view(dim) == "layers" ? L : E;
    if (!it->is_number_unsigned() || it->get<std::uint64_t>() != want)
      throw_config_error(s + "." + dim, it->dump(),
                         "must equal the size of values (" + std::to_string(want) + ")");
  }
  ExpertRanker::Builder b(L, E);
  for (std::uint32_t l = 0; l < L; ++l) {
    const std::string fl = s + ".values[" + std::to_string(l) + "]";
    const auto& row = values[l];
    if (!row.is_array() || row.size() != E)
      throw_config_error(fl,
                         row.is_array() ? std::to_string(row.size()) + " entries" : row.dump().substr(0, 40),
                         "must be an array of " + std::to_string(E) + " numbers (as values[0])");
    for (std::uint32_t e = 0; e < E; ++e) {
      const auto& v = row[e];
      const std::string fe = fl + "[" + std::to_string(e) + "]";
      if (counts) {
        if (!v.is_number_unsigned() || v.get<std::uint64_t>() > (std::uint64_t{1} << 62))
          throw_config_error(fe, v.dump(), "must be a non-negative integer count below 2^62");
        b.add_count(l, e, v.get<std::uint64_t>());
      } else {
        if (!v.is_number() || !(v.get<double>() >= 0.0 && v.get<double>() <= 1.0))
          throw_config_error(fe, v.dump(), "must be a number in [0, 1]");
        b.set_probability(l, e, v.get<double>());
      }
    }
  }
  return b.build();
}

inline ExpertRanker expert_ranker_from_json(std::istream& in, std::string_view source = "json") {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    throw_config_error(std::string(source), "(malformed JSON at byte " + std::to_string(e.byte) + ")",
                       "must be valid JSON");
  }
  return expert_ranker_from_json(j, source);
}
inline ExpertRanker expert_ranker_from_json_string(std::string_view text, std::string_view source = "json") {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw_config_error(std::string(source), "(malformed JSON at byte " + std::to_string(e.byte) + ")",
                       "must be valid JSON");
  }
  return expert_ranker_from_json(j, source);
}
inline ExpertRanker expert_ranker_from_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw_config_error("stats.path", path, "cannot be opened for reading");
  return expert_ranker_from_json(in, path);
}

}  // namespace amoeba
