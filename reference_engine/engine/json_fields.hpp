// Checked reads of JSON fields for every file the engine accepts (model and GPU catalogs, scenario configs,
// cost-model profiles). Each failure throws amoeba::ConfigError naming the dotted field path, the value found
// and the rule it broke, e.g. "scenario.rate = -1: must be > 0". Unknown keys are errors too, so a typo in a
// config file is never silently ignored.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

namespace amoeba::engine {

class JsonObject {
 public:
  // `path` names the object in error messages ("scenario", "model qwen3-30b-a3b").
  JsonObject(const nlohmann::json& j, std::string path);

  bool has(std::string_view key) const;
  std::uint64_t get_uint(std::string_view key, std::uint64_t min, std::uint64_t max) const;
  std::uint64_t get_uint_or(std::string_view key, std::uint64_t fallback, std::uint64_t min,
                            std::uint64_t max) const;
  double get_double(std::string_view key, double min, double max) const;
  double get_double_or(std::string_view key, double fallback, double min, double max) const;
  bool get_bool(std::string_view key) const;
  bool get_bool_or(std::string_view key, bool fallback) const;
  std::string get_string(std::string_view key) const;
  std::string get_string_or(std::string_view key, std::string fallback) const;
  JsonObject get_object(std::string_view key) const;
  bool is_null(std::string_view key) const;
  // Throws if the object holds a key not in `known`.
  void reject_unknown(std::initializer_list<std::string_view> known) const;
  const std::string& path() const noexcept { return path_; }
  const nlohmann::json& raw() const noexcept { return *j_; }

 private:
  const nlohmann::json& at(std::string_view key) const;
  std::string field(std::string_view key) const;
  const nlohmann::json* j_;
  std::string path_;
};

// Parses text as JSON; a syntax error becomes ConfigError(<what>, "<offset>", "is not valid JSON: ...").
nlohmann::json parse_json_text(std::string_view text, const std::string& what);
// Reads a whole file (ConfigError naming the path if it cannot be read).
std::string read_text_file(const std::string& path, const std::string& what);

}  // namespace amoeba::engine
