// The reward factory, its registry of kinds (rewards/registry.inc) and the helpers kinds share.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <regex>

#include <fmt/format.h>

#include "rollout/reward.h"

#include "common/log.h"

namespace arlo::rollout {

Result<std::vector<Score>> RewardModule::score_group(const Task& task, std::span<const Rollout> group) {
  std::vector<Score> out;
  out.reserve(group.size());
  for (const auto& r : group) {
    ARLO_ASSIGN_OR_RETURN(Score s, score(task, r));
    out.push_back(std::move(s));
  }
  return out;
}

std::string trim(std::string_view s) {
  std::size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

std::optional<double> last_number(std::string_view text) {
  static const std::regex number(R"([-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+]?\.\d+)");
  std::optional<double> last;
  const std::string s(text);
  for (auto it = std::sregex_iterator(s.begin(), s.end(), number); it != std::sregex_iterator(); ++it) {
    std::string m = it->str();
    m.erase(std::remove(m.begin(), m.end(), ','), m.end());
    char* end = nullptr;
    const double v = std::strtod(m.c_str(), &end);
    if (end && *end == '\0') last = v;
  }
  return last;
}

std::size_t lcs_length(std::string_view a, std::string_view b) {
  if (a.size() < b.size()) std::swap(a, b);
  std::vector<std::size_t> prev(b.size() + 1, 0), cur(b.size() + 1, 0);
  for (std::size_t i = 1; i <= a.size(); ++i) {
    for (std::size_t j = 1; j <= b.size(); ++j)
      cur[j] = a[i - 1] == b[j - 1] ? prev[j - 1] + 1 : std::max(prev[j], cur[j - 1]);
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// The registered kinds: one function per kind (rewards/<kind>.cc), listed in rewards/registry.inc.
const ExtensionRegistry<RewardKind>& reward_kinds() {
  static const ExtensionRegistry<RewardKind> kinds = {
#include "rollout/rewards/registry.inc"
  };
  return kinds;
}

namespace {

// Keys of a reward.modules item that the config schema gives every item, empty unless its kind
// needs them: the required string config keys of all kinds (path, url, pattern).
bool is_empty_config_key(const std::string& key, const Json& value) {
  if (!value.is_string() || !value.get<std::string>().empty()) return false;
  for (const auto& kind : reward_kinds())
    for (const auto& o : kind.options)
      if (o.config_key && o.required && o.type == OptionSpec::Type::kString && o.key == key) return true;
  return false;
}

bool takes_config_whole(std::string_view type) {
  const RewardKind* kind = find_entry(reward_kinds(), type);
  return kind &&
         std::any_of(kind->options.begin(), kind->options.end(), [](const auto& o) { return o.key == "config"; });
}

// Accepts the config schema's shape ({kind, weight, path, url, pattern, config: {...}}) as well as
// the flat one ({kind, ...options}); "type", the former name of "kind", is read for one release with
// a warning. A built-in's options may sit in "config" (unless the kind takes "config" whole:
// plugin); string config keys left empty are ignored.
Result<Json> normalize_spec(const Json& in) {
  if (!in.is_object())
    return make_error(ErrorCode::kInvalidArgument, "reward spec: expected an object with 'kind' (or 'type')");
  Json spec = in;
  if (spec.contains("type")) {
    if (spec.contains("kind"))
      return make_error(ErrorCode::kInvalidArgument, "reward spec: give 'kind' (or its former name 'type'), not both");
    ARLO_WARN("reward spec: 'type' is the former name of 'kind' (read this release; write kind)");
    spec["kind"] = spec["type"];
    spec.erase("type");
  }
  if (!spec.contains("kind") || !spec["kind"].is_string())
    return make_error(ErrorCode::kInvalidArgument,
                      "reward spec: needs a string 'kind' (exact_match, numeric_match, ...)");
  for (auto it = spec.begin(); it != spec.end();)
    it = is_empty_config_key(it.key(), it.value()) ? spec.erase(it) : std::next(it);
  const std::string kind = spec["kind"].get<std::string>();
  const bool whole = takes_config_whole(kind);
  if (spec.contains("config") && !whole) {
    const Json config = spec["config"];
    spec.erase("config");
    if (!config.is_object())
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("reward '{}': 'config' must be a mapping of options", kind));
    for (const auto& [k, v] : config.items()) {
      if (spec.contains(k))
        return make_error(ErrorCode::kInvalidArgument,
                          fmt::format("reward '{}': option '{}' given twice (in and out of config)", kind, k));
      spec[k] = v;
    }
  }
  if (whole && spec.contains("config") && spec["config"].is_object() && spec["config"].empty() && !in.contains("type"))
    spec["config"] = "";  // the schema default {} means "no config"
  return spec;
}

}  // namespace

Result<std::unique_ptr<RewardModule>> make_reward_module(const Json& raw) {
  if (raw.is_array()) return make_reward_module(Json{{"kind", "weighted"}, {"modules", raw}});
  ARLO_ASSIGN_OR_RETURN(const Json spec, normalize_spec(raw));
  const std::string kind_name = spec["kind"].get<std::string>();
  const std::string who = fmt::format("reward '{}'", kind_name);
  if (spec.contains("name") && !spec["name"].is_string())
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("{}: option 'name' has the wrong type ({})", who, spec["name"].dump()));
  ARLO_ASSIGN_OR_RETURN(const RewardKind* kind, find_reward_kind(kind_name));
  ARLO_ASSIGN_OR_RETURN(const Json options, resolve_options(who, kind->options, spec, {"kind", "name", "weight"}));
  return kind->make(RewardSpec{options, spec.value("name", kind_name), spec.contains("name")});
}

}  // namespace arlo::rollout
