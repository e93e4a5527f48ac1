// Errors for bad user input (configuration, files, flags). Every message names the field, the value and the
// rule that was broken, e.g. "pool.kv.page_bytes = 18432: must divide the expert page (5767168 bytes)".
// Shortfalls at run time are values (see expected.hpp), never these exceptions.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace amoeba {

class ConfigError : public std::invalid_argument {
 public:
  ConfigError(std::string field, std::string value, std::string rule)
      : std::invalid_argument(field + " = " + value + ": " + rule),
        field_(std::move(field)),
        value_(std::move(value)),
        rule_(std::move(rule)) {}

  const std::string& field() const noexcept { return field_; }
  const std::string& value() const noexcept { return value_; }
  const std::string& rule() const noexcept { return rule_; }

 private:
  std::string field_, value_, rule_;
};

template <class V>
[[noreturn]] void throw_config_error(std::string field, const V& value, std::string rule) {
  std::ostringstream os;
  os << value;
  throw ConfigError(std::move(field), os.str(), std::move(rule));
}

}  // namespace amoeba
