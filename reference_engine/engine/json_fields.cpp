// Checked JSON field reads; see json_fields.hpp.
#include "engine/json_fields.hpp"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "amoeba/core/errors.hpp"

namespace amoeba::engine {

namespace {

// Cuts `s` to at most `n` bytes without splitting a UTF-8 sequence.
std::size_t utf8_cut(std::string_view s, std::size_t n) {
  if (n >= s.size()) return s.size();
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return n;
}

void render_string(const std::string& s, std::string& out, std::size_t limit) {
  // Only the part that can still be shown is escaped; a cut inside a UTF-8 sequence is replaced, not thrown.
  const std::size_t room = limit + 1 > out.size() ? limit + 1 - out.size() : 0;
  out += nlohmann::json(s.substr(0, std::min(room, s.size())))
             .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Compact JSON of `v`, stopping once `out` is longer than `limit`: each level appends a bracket before it
// descends, so the recursion is at most `limit` deep whatever the value.
void render(const nlohmann::json& v, std::string& out, std::size_t limit) {
  if (out.size() > limit) return;
  if (v.is_object()) {
    out += '{';
    for (auto it = v.begin(); it != v.end() && out.size() <= limit; ++it) {
      if (it != v.begin()) out += ',';
      render_string(it.key(), out, limit);
      out += ':';
      render(it.value(), out, limit);
    }
    out += '}';
  } else if (v.is_array()) {
    out += '[';
    for (auto it = v.begin(); it != v.end() && out.size() <= limit; ++it) {
      if (it != v.begin()) out += ',';
      render(*it, out, limit);
    }
    out += ']';
  } else if (v.is_string()) {
    render_string(v.get_ref<const std::string&>(), out, limit);
  } else {
    out += v.dump();  // a number, a boolean or null: short
  }
}

// Builds the value from nlohmann's SAX events, refusing a key repeated within one object (the DOM parser
// would silently keep the last one). Containers on the stack stay put: only the innermost one grows.
class StrictBuilder {
 public:
  using json = nlohmann::json;
  explicit StrictBuilder(json& root) : root_(root) {}

  bool null() { return leaf(json(nullptr)); }
  bool boolean(bool v) { return leaf(json(v)); }
  bool number_integer(json::number_integer_t v) { return leaf(json(v)); }
  bool number_unsigned(json::number_unsigned_t v) { return leaf(json(v)); }
  bool number_float(json::number_float_t v, const json::string_t&) { return leaf(json(v)); }
  bool string(json::string_t& v) { return leaf(json(std::move(v))); }
  bool binary(json::binary_t& v) { return leaf(json(json::binary_t(std::move(v)))); }
  bool start_object(std::size_t) { return open(json::object()); }
  bool start_array(std::size_t) { return open(json::array()); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(json::string_t& k) {
    if (stack_.back()->contains(k)) {
      duplicate_ = true;
      object_path_ = path();
      duplicate_key_ = k;
      return false;
    }
    key_ = std::move(k);
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) {
    error_position_ = position;
    error_ = e.what();
    return false;
  }

  bool duplicate_ = false;
  std::string object_path_, duplicate_key_;
  std::size_t error_position_ = 0;
  std::string error_;

 private:
  // Places `v` in the innermost container, or as the root.
  json* insert(json&& v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    json& top = *stack_.back();
    if (top.is_array()) {
      top.push_back(std::move(v));
      return &top.back();
    }
    json& slot = top[key_];
    slot = std::move(v);
    return &slot;
  }
  bool leaf(json&& v) {
    insert(std::move(v));
    return true;
  }
  // Only containers are named: an error path ends at the object holding the repeated key.
  bool open(json&& v) {
    if (stack_.empty())
      names_.emplace_back();
    else if (stack_.back()->is_array())
      names_.push_back("[" + std::to_string(stack_.back()->size()) + "]");
    else
      names_.push_back("." + quote_text(key_));
    stack_.push_back(insert(std::move(v)));
    return true;
  }
  bool close() {
    stack_.pop_back();
    names_.pop_back();
    return true;
  }
  std::string path() const {
    std::string p;
    for (const std::string& n : names_) p += n;
    return p;
  }

  json& root_;
  std::vector<json*> stack_;
  std::vector<std::string> names_;  // one per open container
  std::string key_;
};

}  // namespace

std::string quote_json(const nlohmann::json& v) {
  std::string out;
  render(v, out, kMaxQuotedChars);
  if (out.size() > kMaxQuotedChars) out = out.substr(0, utf8_cut(out, kMaxQuotedChars - 3)) + "...";
  return out;
}

std::string quote_text(std::string_view s, std::size_t max_chars) {
  const bool cut = s.size() > max_chars;
  if (cut) s = s.substr(0, utf8_cut(s, max_chars > 3 ? max_chars - 3 : 0));
  std::string out;
  out.reserve(s.size() + 3);
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  if (cut) out += "...";
  return out;
}

JsonObject::JsonObject(const nlohmann::json& j, std::string path) : j_(&j), path_(std::move(path)) {
  if (!j.is_object()) throw ConfigError(path_, quote_json(j), "must be a JSON object");
}

std::string JsonObject::field(std::string_view key) const {
  return path_ + "." + quote_text(key);
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
    throw ConfigError(field(key), quote_json(v), "must be a non-negative integer");
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!(d >= 0.0) || d != std::floor(d))
      throw ConfigError(field(key), quote_json(v), "must be a non-negative integer");
    if (d > double(max))
      throw ConfigError(field(key), quote_json(v),
                        "must be in [" + std::to_string(min) + ", " + std::to_string(max) + "]");
    // Above 2^53 the parser has already rounded the digits: the number read is not the one written.
    if (d > kMaxExactIntegerDouble)
      throw ConfigError(field(key), quote_json(v),
                        "must be written as an integer literal (a fraction or exponent form above 2^53 loses "
                        "digits)");
    x = static_cast<std::uint64_t>(d);
  } else {
    throw ConfigError(field(key), quote_json(v), "must be a non-negative integer");
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
  if (!v.is_number()) throw ConfigError(field(key), quote_json(v), "must be a number");
  const double d = v.get<double>();
  if (!std::isfinite(d) || d < min || d > max) {
    std::ostringstream rule;
    rule << "must be a finite number in [" << min << ", " << max << "]";
    throw ConfigError(field(key), quote_json(v), rule.str());
  }
  return d;
}
double JsonObject::get_double_or(std::string_view key, double fallback, double min, double max) const {
  return has(key) ? get_double(key, min, max) : fallback;
}

bool JsonObject::get_bool(std::string_view key) const {
  const nlohmann::json& v = at(key);
  if (!v.is_boolean()) throw ConfigError(field(key), quote_json(v), "must be true or false");
  return v.get<bool>();
}
bool JsonObject::get_bool_or(std::string_view key, bool fallback) const {
  return has(key) ? get_bool(key) : fallback;
}

std::string JsonObject::get_string(std::string_view key) const {
  const nlohmann::json& v = at(key);
  if (!v.is_string()) throw ConfigError(field(key), quote_json(v), "must be a string");
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
      throw ConfigError(field(it.key()), quote_json(it.value()),
                        "is not a known field (known: " + list + ")");
    }
  }
}

nlohmann::json parse_json_text(std::string_view text, const std::string& what) {
  // Depth first, on the text: nothing is built for input that nests too deep.
  std::size_t depth = 0;
  bool in_string = false, escaped = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth)
        throw ConfigError(what, "byte " + std::to_string(i),
                          "nests arrays/objects more than " + std::to_string(kMaxJsonDepth) + " levels deep");
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  nlohmann::json j;
  StrictBuilder sax(j);
  bool ok = false;
  try {
    ok = nlohmann::json::sax_parse(text.begin(), text.end(), &sax);
  } catch (const nlohmann::json::exception& e) {  // not expected from the SAX path; kept as a bad-input error
    throw ConfigError(what, "(text)", "is not valid JSON: " + quote_text(e.what(), 200));
  }
  if (sax.duplicate_)
    throw ConfigError(what + sax.object_path_ + "." + quote_text(sax.duplicate_key_), "(given twice)",
                      "a key may appear only once in an object");
  if (!ok)
    throw ConfigError(what, "byte " + std::to_string(sax.error_position_),
                      "is not valid JSON: " + quote_text(sax.error_, 200));
  return j;
}

std::string read_text_file(const std::string& path, const std::string& what, std::uint64_t max_bytes) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw ConfigError(what, path, "is a directory, not a file");
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw ConfigError(what, path, std::string("cannot be opened for reading: ") + std::strerror(errno));
  // Read in chunks up to the limit: the size a stat reports means nothing for /dev/zero or a pipe.
  std::string text;
  char buf[1 << 16];
  while (in) {
    in.read(buf, sizeof buf);
    text.append(buf, static_cast<std::size_t>(in.gcount()));
    if (text.size() > max_bytes)
      throw ConfigError(what, path, "is larger than " + std::to_string(max_bytes) + " bytes");
  }
  if (in.bad()) throw ConfigError(what, path, "could not be read");
  return text;
}

}  // namespace amoeba::engine
