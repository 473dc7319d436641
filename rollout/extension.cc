#include "rollout/extension.h"

#include <algorithm>

namespace arlo::rollout {

ExtensionOption ExtensionOption::as_config_key(Json def) && {
  config_key = true;
  config_default = std::move(def);
  return std::move(*this);
}
ExtensionOption ExtensionOption::must_be_given() && {
  required = true;
  return std::move(*this);
}
ExtensionOption ExtensionOption::one_of(std::vector<std::string> allowed) && {
  choices = std::move(allowed);
  return std::move(*this);
}
ExtensionOption ExtensionOption::range(double lo, double hi) && {
  min = lo;
  max = hi;
  return std::move(*this);
}
ExtensionOption ExtensionOption::checked_by(std::string (*fn)(const Json& value)) && {
  check = fn;
  return std::move(*this);
}

namespace {
ExtensionOption option(std::string key, ExtensionOption::Type type, Json def, std::string doc) {
  ExtensionOption o;
  o.key = std::move(key);
  o.type = type;
  o.default_value = std::move(def);
  o.doc = std::move(doc);
  return o;
}

// Whether `v` reads as `type` (the conversions nlohmann's get<T>() accepts).
bool readable_as(const Json& v, ExtensionOption::Type type) {
  try {
    switch (type) {
      case ExtensionOption::Type::kBool: (void)v.get<bool>(); break;
      case ExtensionOption::Type::kInt: (void)v.get<std::int64_t>(); break;
      case ExtensionOption::Type::kFloat: (void)v.get<double>(); break;
      case ExtensionOption::Type::kString: (void)v.get<std::string>(); break;
      case ExtensionOption::Type::kAny: break;
    }
    return true;
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}
}  // namespace

ExtensionOption bool_opt(std::string key, Json def, std::string doc) {
  return option(std::move(key), ExtensionOption::Type::kBool, std::move(def), std::move(doc));
}
ExtensionOption int_opt(std::string key, Json def, std::string doc) {
  return option(std::move(key), ExtensionOption::Type::kInt, std::move(def), std::move(doc));
}
ExtensionOption float_opt(std::string key, Json def, std::string doc) {
  return option(std::move(key), ExtensionOption::Type::kFloat, std::move(def), std::move(doc));
}
ExtensionOption string_opt(std::string key, Json def, std::string doc) {
  return option(std::move(key), ExtensionOption::Type::kString, std::move(def), std::move(doc));
}
ExtensionOption any_opt(std::string key, std::string doc) {
  return option(std::move(key), ExtensionOption::Type::kAny, nullptr, std::move(doc));
}

std::string_view type_name(ExtensionOption::Type type) {
  switch (type) {
    case ExtensionOption::Type::kBool: return "bool";
    case ExtensionOption::Type::kInt: return "int";
    case ExtensionOption::Type::kFloat: return "float";
    case ExtensionOption::Type::kString: return "string";
    case ExtensionOption::Type::kAny: return "any";
  }
  return "?";
}

Result<Json> resolve_options(std::string_view who, const std::vector<ExtensionOption>& declared, const Json& options,
                             const std::vector<std::string>& keys_ok) {
  Json out = options.is_object() ? options : Json::object();
  for (const auto& [k, v] : out.items()) {
    if (std::find(keys_ok.begin(), keys_ok.end(), k) != keys_ok.end()) continue;
    if (std::none_of(declared.begin(), declared.end(), [&](const ExtensionOption& o) { return o.key == k; })) {
      std::vector<std::string> known = keys_ok;
      for (const auto& o : declared) known.push_back(o.key);
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("{}: unknown option '{}' (known: {})", who, k, join_names(known, ", ")));
    }
  }
  for (const auto& o : declared) {
    if (!out.contains(o.key)) {
      if (!o.default_value.is_null()) out[o.key] = o.default_value;
      continue;
    }
    if (!readable_as(out[o.key], o.type))
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("{}: option '{}' has the wrong type ({})", who, o.key, out[o.key].dump()));
  }
  return out;
}

}  // namespace arlo::rollout
