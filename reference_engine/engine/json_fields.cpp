// Checked JSON field reads; see json_fields.hpp.
#include "engine/json_fields.hpp"

#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "amoeba/core/errors.hpp"

namespace amoeba::engine {

namespace {
std::string shown(const nlohmann::json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}
}  // namespace

JsonObject::JsonObject(const nlohmann::json& j, std::string path) : j_(&j), path_(std::move(path)) {
  if (!j.is_object()) throw ConfigError(path_, shown(j), "must be a JSON object");
}

std::string JsonObject::field(std::string_view key) const {
  return path_ + "." + std::string(key);
}

bool JsonObject::has(std::string_view key) const {
  return j_->contains(key);
}
bool JsonObject::is_null(std::string_view key) const {
  return !has(key) || at(key).is_null();
}

const nlohmann::json& JsonObject::at(std::string_view key) const {
  auto it = j_->find(key);
  if (it == j_->end()) throw ConfigError(field(key), "(missing)", "is required");
  return *it;
}

std::uint64_t JsonObject::get_uint(std::string_view key, std::uint64_t min, std::uint64_t max) const {
  const nlohmann::json& v = at(key);
  std::uint64_t x = 0;
  if (v.is_number_unsigned()) {
    x = v.get<std::uint64_t>();
  } else if (v.is_number_integer()) {
    throw ConfigError(field(key), shown(v), "must be a non-negative integer");
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!(d >= 0.0) || d != std::floor(d) || d > 1.8e19)
      throw ConfigError(field(key), shown(v), "must be a non-negative integer");
    x = static_cast<std::uint64_t>(d);
  } else {
    throw ConfigError(field(key), shown(v), "must be a non-negative integer");
  }
  if (x < min || x > max)
    throw ConfigError(field(key), std::to_string(x),
                      "must be in [" + std::to_string(min) + ", " + std::to_string(max) + "]");
  return x;
}
std::uint64_t JsonObject::get_uint_or(std::string_view key, std::uint64_t fallback, std::uint64_t min,
                                      std::uint64_t max) const {
  return has(key) ? get_uint(key, min, max) : fallback;
}

double JsonObject::get_double(std::string_view key, double min, double max) const {
  const nlohmann::json& v = at(key);
  if (!v.is_number()) throw ConfigError(field(key), shown(v), "must be a number");
  const double d = v.get<double>();
  if (!std::isfinite(d) || d < min || d > max) {
    std::ostringstream rule;
    rule << "must be a finite number in [" << min << ", " << max << "]";
    throw ConfigError(field(key), shown(v), rule.str());
  }
  return d;
}
double JsonObject::get_double_or(std::string_view key, double fallback, double min, double max) const {
  return has(key) ? get_double(key, min, max) : fallback;
}

bool JsonObject::get_bool(std::string_view key) const {
  const nlohmann::json& v = at(key);
  if (!v.is_boolean()) throw ConfigError(field(key), shown(v), "must be true or false");
  return v.get<bool>();
}
bool JsonObject::get_bool_or(std::string_view key, bool fallback) const {
  return has(key) ? get_bool(key) : fallback;
}

std::string JsonObject::get_string(std::string_view key) const {
  const nlohmann::json& v = at(key);
  if (!v.is_string()) throw ConfigError(field(key), shown(v), "must be a string");
  return v.get<std::string>();
}
std::string JsonObject::get_string_or(std::string_view key, std::string fallback) const {
  return has(key) ? get_string(key) : fallback;
}

JsonObject JsonObject::get_object(std::string_view key) const {
  return JsonObject(at(key), field(key));
}

void JsonObject::reject_unknown(std::initializer_list<std::string_view> known) const {
  for (auto it = j_->begin(); it != j_->end(); ++it) {
    bool ok = false;
    for (std::string_view k : known) ok = ok || k == it.key();
    if (!ok) {
      std::string list;
      for (std::string_view k : known) list += (list.empty() ? "" : ", ") + std::string(k);
      throw ConfigError(field(it.key()), shown(it.value()), "is not a known field (known: " + list + ")");
    }
  }
}

nlohmann::json parse_json_text(std::string_view text, const std::string& what) {
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    throw ConfigError(what, "byte " + std::to_string(e.byte), std::string("is not valid JSON: ") + e.what());
  } catch (const nlohmann::json::exception& e) {  // e.g. a number that overflows a double
    throw ConfigError(what, "(text)", std::string("is not valid JSON: ") + e.what());
  }
}

std::string read_text_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(what, path, "cannot be opened for reading");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw ConfigError(what, path, "could not be read");
  return ss.str();
}

}  // namespace amoeba::engine
