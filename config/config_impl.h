#pragma once
// Internal to config/: the resolved values behind a Config. Not for other modules.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "config/config.h"
#include "config/schema.h"

namespace arlo::config {

struct Value {
  using Data = std::variant<bool, std::int64_t, double, std::string, std::vector<std::string>, nlohmann::json,
                            std::vector<Config>>;
  Type type = Type::kString;
  Data data;
  std::string where;  // location of the value, "default" when not given by the user
  bool set = false;   // given by the user (file or --set)
};

struct Config::Impl {
  // Exactly one of these is set: the root knows its schema (values keyed "section.key"), an
  // object-list item knows its item keys (values keyed "key").
  const Schema* schema = nullptr;
  const std::vector<Key>* item_keys = nullptr;
  std::map<std::string, Value, std::less<>> values;
};

// "1", "0.25", "1.0" (floats always show a '.' or an exponent so they read back as floats).
std::string format_float(double value);
// Bounds and ranges in messages: integers without a fraction.
std::string format_bound(double value);

}  // namespace arlo::config
