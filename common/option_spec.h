#pragma once
// An option an extension declares: the one type of the options of every registry of extensions
// (common/registry.h): weight-sync transports (weight_sync/transport.h), reward kinds
// (rollout/reward.h), admin dialects (rollout/admin.h) and environments (rollout/environment.h).
// An entry of a registry carries its name, its factory and its options (type, default, bounds,
// doc). The config schema (config/schema.cc) turns the options marked user_key() into config
// keys and docs/configuration.md; nothing else lists them.
//
//   string_option("dir", "", "where versions live").user_key("{run.dir}/weights").is_path()
//   int_option("max_len", 8, "longest string.").range(1, 4096).user_key()
//   string_option("pattern", nullptr, "...").user_key("").must_be_given().checked_by(check_pattern)
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"

namespace arlo {

struct OptionSpec {
  enum class Type { kBool, kInt, kFloat, kString, kAny };
  std::string key;
  Type type = Type::kString;
  nlohmann::json default_value;  // filled in when the option is left out; null: left out
  std::string doc;
  std::vector<std::string> choices;  // kString: the allowed values (empty: any)
  std::optional<double> min, max;    // kInt / kFloat: inclusive bounds
  // A key of the user's config: of the extension's section or item (weight_sync.address,
  // env.max_operand, reward.modules[].path), documented in docs/configuration.md. The others are
  // set by arlo (a transport's endpoints) or sit in a free-form `config` map (a reward kind's).
  bool config_key = false;
  nlohmann::json config_default;  // the config key's default when it differs (null: default_value);
                                  // strings may use "{section.key}" templates
  bool required = false;          // config: the key must be given (not empty)
  bool path = false;              // kString: a filesystem path (callers make it absolute)
  // Config: a further check of the given value; returns what is wrong ("" when fine).
  std::string (*check)(const nlohmann::json& value) = nullptr;

  OptionSpec user_key(nlohmann::json config_default = nullptr) &&;  // sets config_key (and config_default)
  OptionSpec must_be_given() &&;
  OptionSpec one_of(std::vector<std::string> allowed) &&;
  OptionSpec range(double lo, double hi) &&;
  OptionSpec checked_by(std::string (*fn)(const nlohmann::json& value)) &&;
  OptionSpec is_path() &&;

  const nlohmann::json& config_value() const { return config_default.is_null() ? default_value : config_default; }
};

// Builders; bounds, choices and the rest are modifiers: int_option(key, def, doc).range(min, max).
OptionSpec bool_option(std::string key, nlohmann::json def, std::string doc);
OptionSpec int_option(std::string key, nlohmann::json def, std::string doc);
OptionSpec float_option(std::string key, nlohmann::json def, std::string doc);
OptionSpec string_option(std::string key, nlohmann::json def, std::string doc);
OptionSpec any_option(std::string key, std::string doc);

// "bool", "int", "float", "string", "any".
std::string_view type_name(OptionSpec::Type type);

// What is wrong with a given `value` of option `o` beyond its type (resolve_options checks that):
// outside its bounds, not one of its choices, or refused by its check. "" when nothing is.
std::string check_option_value(const OptionSpec& o, const nlohmann::json& value);

// `options` with each declared option's type checked and its default filled in where absent;
// `keys_ok` lists keys that are not options but allowed (name, weight). Errors start with `who`:
//   "<who>: unknown option 'x' (known: <keys_ok>, <options>)"
//   "<who>: option 'x' has the wrong type (<value>)"
Result<nlohmann::json> resolve_options(std::string_view who, const std::vector<OptionSpec>& declared,
                                       const nlohmann::json& options, const std::vector<std::string>& keys_ok);

}  // namespace arlo
