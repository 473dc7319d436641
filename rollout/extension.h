#pragma once
// What the rollout extension registries share: the options an extension declares (the registry
// itself, lookup by name included, is common/registry.h, which weight_sync's transports use too).
// Each kind of extension has one registry, one file per entry and one line per entry in its
// registry.inc:
//
//   reward modules       rollout/rewards/        RewardKind          (rollout/reward.h)
//   admin dialects       rollout/admin_dialects/ AdminDialectInfo    (rollout/admin.h)
//   environments         rollout/environments/   EnvironmentKind     (rollout/environment.h)
//
// An entry carries its name, its factory and its options (type, default, bounds, doc). The config
// schema (common/config/schema.cc) builds the allowed kinds, their config keys and
// docs/configuration.md from the registries; nothing else lists them.
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "common/registry.h"
#include "common/result.h"
#include "rollout/types.h"

namespace arlo::rollout {

// One option of an extension.
struct ExtensionOption {
  enum class Type { kBool, kInt, kFloat, kString, kAny };
  std::string key;
  Type type = Type::kString;
  Json default_value;  // filled in when the spec leaves the option out; null: left out
  std::string doc;
  std::vector<std::string> choices;  // kString: allowed values (empty: any)
  std::optional<double> min, max;    // kInt / kFloat: inclusive bounds in the config
  Json config_default;               // the config key's default when it differs (null: default_value)
  // Config keys of the extension's own item or section (reward.modules[]: path, url, pattern; env:
  // max_operand, ...) rather than inside a free-form `config` map.
  bool config_key = false;
  bool required = false;  // config: the key must be given (not empty) for this kind
  // Config: a further check of the given value; returns what is wrong ("" when fine).
  std::string (*check)(const Json& value) = nullptr;

  // Builders: string_opt("pattern", nullptr, "...").as_config_key("").must_be_given().
  ExtensionOption as_config_key(Json config_default = nullptr) &&;
  ExtensionOption must_be_given() &&;
  ExtensionOption one_of(std::vector<std::string> allowed) &&;
  ExtensionOption range(double lo, double hi) &&;
  ExtensionOption checked_by(std::string (*fn)(const Json& value)) &&;

  const Json& config_value() const { return config_default.is_null() ? default_value : config_default; }
};
ExtensionOption bool_opt(std::string key, Json def, std::string doc);
ExtensionOption int_opt(std::string key, Json def, std::string doc);
ExtensionOption float_opt(std::string key, Json def, std::string doc);
ExtensionOption string_opt(std::string key, Json def, std::string doc);
ExtensionOption any_opt(std::string key, std::string doc);

// "bool", "int", "float", "string", "any".
std::string_view type_name(ExtensionOption::Type type);

// `options` with each declared option's type checked and its default filled in where absent;
// `keys_ok` lists keys that are not options but allowed (name, weight). Errors start with `who`:
//   "<who>: unknown option 'x' (known: <keys_ok>, <options>)"
//   "<who>: option 'x' has the wrong type (<value>)"
Result<Json> resolve_options(std::string_view who, const std::vector<ExtensionOption>& declared, const Json& options,
                             const std::vector<std::string>& keys_ok);

}  // namespace arlo::rollout
