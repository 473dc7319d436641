#include "common/option_spec.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/registry.h"

namespace arlo {

OptionSpec OptionSpec::user_key(nlohmann::json def) && {
  config_key = true;
  config_default = std::move(def);
  return std::move(*this);
}
OptionSpec OptionSpec::must_be_given() && {
  required = true;
  return std::move(*this);
}
OptionSpec OptionSpec::one_of(std::vector<std::string> allowed) && {
  choices = std::move(allowed);
  return std::move(*this);
}
OptionSpec OptionSpec::range(double lo, double hi) && {
  min = lo;
  max = hi;
  return std::move(*this);
}
OptionSpec OptionSpec::checked_by(std::string (*fn)(const nlohmann::json& value)) && {
  check = fn;
  return std::move(*this);
}
OptionSpec OptionSpec::is_path() && {
  path = true;
  return std::move(*this);
}

namespace {
OptionSpec option(std::string key, OptionSpec::Type type, nlohmann::json def, std::string doc) {
  OptionSpec o;
  o.key = std::move(key);
  o.type = type;
  o.default_value = std::move(def);
  o.doc = std::move(doc);
  return o;
}

// Whether `v` reads as `type` (the conversions nlohmann's get<T>() accepts).
bool readable_as(const nlohmann::json& v, OptionSpec::Type type) {
  try {
    switch (type) {
      case OptionSpec::Type::kBool: (void)v.get<bool>(); break;
      case OptionSpec::Type::kInt: (void)v.get<std::int64_t>(); break;
      case OptionSpec::Type::kFloat: (void)v.get<double>(); break;
      case OptionSpec::Type::kString: (void)v.get<std::string>(); break;
      case OptionSpec::Type::kAny: break;
    }
    return true;
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}
}  // namespace

OptionSpec bool_option(std::string key, nlohmann::json def, std::string doc) {
  return option(std::move(key), OptionSpec::Type::kBool, std::move(def), std::move(doc));
}
OptionSpec int_option(std::string key, nlohmann::json def, std::string doc) {
  return option(std::move(key), OptionSpec::Type::kInt, std::move(def), std::move(doc));
}
OptionSpec float_option(std::string key, nlohmann::json def, std::string doc) {
  return option(std::move(key), OptionSpec::Type::kFloat, std::move(def), std::move(doc));
}
OptionSpec string_option(std::string key, nlohmann::json def, std::string doc) {
  return option(std::move(key), OptionSpec::Type::kString, std::move(def), std::move(doc));
}
OptionSpec any_option(std::string key, std::string doc) {
  return option(std::move(key), OptionSpec::Type::kAny, nullptr, std::move(doc));
}

std::string_view type_name(OptionSpec::Type type) {
  switch (type) {
    case OptionSpec::Type::kBool: return "bool";
    case OptionSpec::Type::kInt: return "int";
    case OptionSpec::Type::kFloat: return "float";
    case OptionSpec::Type::kString: return "string";
    case OptionSpec::Type::kAny: return "any";
  }
  return "?";
}

std::string check_option_value(const OptionSpec& o, const nlohmann::json& v) {
  if (v.is_number() && ((o.min && v.get<double>() < *o.min) || (o.max && v.get<double>() > *o.max)))
    return fmt::format("{} is outside [{}, {}]", v.dump(), o.min ? fmt::format("{}", *o.min) : "-inf",
                       o.max ? fmt::format("{}", *o.max) : "inf");
  if (v.is_string() && !o.choices.empty() &&
      std::find(o.choices.begin(), o.choices.end(), v.get<std::string>()) == o.choices.end())
    return fmt::format("'{}' is not one of {}", v.get<std::string>(), join_names(o.choices, ", "));
  return o.check ? o.check(v) : std::string();
}

Result<nlohmann::json> resolve_options(std::string_view who, const std::vector<OptionSpec>& declared,
                                       const nlohmann::json& options, const std::vector<std::string>& keys_ok) {
  nlohmann::json out = options.is_object() ? options : nlohmann::json::object();
  for (const auto& [k, v] : out.items()) {
    if (std::find(keys_ok.begin(), keys_ok.end(), k) != keys_ok.end()) continue;
    if (std::none_of(declared.begin(), declared.end(), [&](const OptionSpec& o) { return o.key == k; })) {
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

}  // namespace arlo
