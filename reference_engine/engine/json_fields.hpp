// Checked reads of JSON fields for every file the engine accepts (model and GPU catalogs, scenario configs,
// cost-model profiles, trace lines). Each failure throws amoeba::ConfigError naming the dotted field path,
// the value found and the rule it broke, e.g. "scenario.rate = -1: must be > 0". Unknown keys are errors too,
// so a typo in a config file is never silently ignored; so is a key given twice (JSON leaves its meaning
// open).
//
// Hostile input stays bounded: text nesting arrays/objects deeper than kMaxJsonDepth is refused before a
// value is built (every later walk of a value recurses), and a value quoted in an error is cut to
// kMaxQuotedChars characters however large it is.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

namespace amoeba::engine {

// The deepest config needs 3 levels; 32 leaves room and keeps recursion over a value shallow.
inline constexpr std::size_t kMaxJsonDepth = 32;
// Longest quotation of a value in an error message.
inline constexpr std::size_t kMaxQuotedChars = 60;
// Largest file read_text_file accepts by default: a trace of the most requests (10^7 lines of ~70 bytes)
// fits.
inline constexpr std::uint64_t kMaxInputFileBytes = std::uint64_t{1} << 30;
// Largest config, model, GPU or cost-model file: the catalog's files are a few KiB.
inline constexpr std::uint64_t kMaxConfigFileBytes = std::uint64_t{16} << 20;
// Largest integer a JSON number written with a fraction or exponent may hold exactly (2^53).
inline constexpr double kMaxExactIntegerDouble = 9007199254740992.0;

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

// A JSON value as an error message quotes it: compact, at most kMaxQuotedChars characters, built without
// walking (or copying) more of the value than it shows.
std::string quote_json(const nlohmann::json& v);
// A piece of user text as an error message quotes it: at most `max_chars` characters (then "..."), control
// bytes escaped as \xNN so that a message cannot drive the terminal.
std::string quote_text(std::string_view s, std::size_t max_chars = kMaxQuotedChars);

// Parses text as JSON. Errors are ConfigError naming `what`: a syntax error ("byte N", "is not valid JSON:
// ..."), nesting deeper than kMaxJsonDepth, a number out of double range, or a key repeated in one object.
nlohmann::json parse_json_text(std::string_view text, const std::string& what);
// Reads a whole file. ConfigError naming `what` and the path if it is a directory, cannot be read, or holds
// more than `max_bytes` bytes (so /dev/zero or a huge file is refused instead of filling memory).
std::string read_text_file(const std::string& path, const std::string& what,
                           std::uint64_t max_bytes = kMaxInputFileBytes);

}  // namespace amoeba::engine
