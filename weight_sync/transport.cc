#include "weight_sync/transport.h"

#include "weight_sync/collective.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace arlo::weight_sync {

// The registered transports: one function per transport (transports/<name>.cc or transports/<name>/),
// listed in transports/registry.inc.
const ExtensionRegistry<TransportDescriptor>& transports() {
  static const ExtensionRegistry<TransportDescriptor> all = {
#include "weight_sync/transports/registry.inc"
  };
  return all;
}

const OptionSpec* TransportDescriptor::option(std::string_view key) const {
  for (const auto& o : options)
    if (o.key == key) return &o;
  return nullptr;
}

namespace {

bool has_type(const nlohmann::json& v, OptionSpec::Type t) {
  switch (t) {
    case OptionSpec::Type::kBool: return v.is_boolean();
    case OptionSpec::Type::kInt: return v.is_number_integer();
    case OptionSpec::Type::kFloat: return v.is_number();
    case OptionSpec::Type::kString: return v.is_string();
    case OptionSpec::Type::kAny: return true;
  }
  return false;
}

std::string_view type_word(OptionSpec::Type t) {
  switch (t) {
    case OptionSpec::Type::kBool: return "a boolean";
    case OptionSpec::Type::kInt: return "an integer";
    case OptionSpec::Type::kFloat: return "a number";
    case OptionSpec::Type::kString: return "a string";
    case OptionSpec::Type::kAny: return "any value";
  }
  return "?";
}

Status check_value(const TransportDescriptor& d, const OptionSpec& o, const nlohmann::json& v) {
  auto bad = [&](const std::string& why) {
    return make_error(ErrorCode::kInvalidArgument, fmt::format("weight_sync {} option '{}': {}", d.name, o.key, why));
  };
  if (!has_type(v, o.type)) return bad(fmt::format("must be {}, got {}", type_word(o.type), v.dump()));
  if (v.is_number()) {
    const double x = v.get<double>();
    if ((o.min && x < *o.min) || (o.max && x > *o.max))
      return bad(fmt::format("{} is outside [{}, {}]", v.dump(), o.min ? fmt::format("{}", *o.min) : "-inf",
                             o.max ? fmt::format("{}", *o.max) : "inf"));
  }
  if (v.is_string() && !o.choices.empty() &&
      std::find(o.choices.begin(), o.choices.end(), v.get<std::string>()) == o.choices.end())
    return bad(fmt::format("'{}' is not one of {}", v.get<std::string>(), fmt::join(o.choices, " | ")));
  return ok();
}

}  // namespace

Result<nlohmann::json> resolve_params(const TransportDescriptor& d, const nlohmann::json& params) {
  if (!params.is_null() && !params.is_object())
    return make_error(ErrorCode::kInvalidArgument, fmt::format("weight_sync {} options must be an object", d.name));
  nlohmann::json out = nlohmann::json::object();
  if (params.is_object()) {
    for (const auto& [key, value] : params.items()) {
      const OptionSpec* o = d.option(key);
      if (o == nullptr) {
        std::vector<std::string> keys;
        for (const auto& spec : d.options) keys.push_back(spec.key);
        return make_error(ErrorCode::kInvalidArgument, fmt::format("weight_sync {} has no option '{}'; its options: {}",
                                                                   d.name, key, fmt::join(keys, ", ")));
      }
      ARLO_TRY(check_value(d, *o, value));
      out[key] = value;
    }
  }
  for (const auto& o : d.options)
    if (!out.contains(o.key)) out[o.key] = o.default_value;
  return out;
}

Result<std::unique_ptr<CollectiveControl>> CollectiveControl::connect(const Announcement& a, Deadline deadline) {
  ARLO_ASSIGN_OR_RETURN(const auto* d, find_transport(a.transport));
  if (!d->capabilities.collective || !d->control)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("weight_sync: transport {} is not collective", a.transport));
  return d->control(a.endpoint, deadline);
}

}  // namespace arlo::weight_sync
