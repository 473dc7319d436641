// Built-in reward modules and the factory.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <regex>

#include <fmt/format.h>

#include "rollout/reward.h"
#include "rollout/reward_plugin_loader.h"
#include "rollout/reward_http.h"

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

namespace {

class NamedModule : public RewardModule {
 public:
  explicit NamedModule(std::string name) : name_(std::move(name)) {}
  const std::string& name() const override { return name_; }

 private:
  std::string name_;
};

class ExactMatch : public NamedModule {
 public:
  ExactMatch(std::string name, bool case_sensitive) : NamedModule(std::move(name)), case_sensitive_(case_sensitive) {}
  Result<Score> score(const Task& task, const Rollout& r) override {
    std::string a = trim(r.completion_text), b = trim(task.answer);
    if (!case_sensitive_) {
      for (auto* s : {&a, &b})
        std::transform(s->begin(), s->end(), s->begin(), [](unsigned char c) { return std::tolower(c); });
    }
    return Score{a == b ? 1.0 : 0.0, {}};
  }

 private:
  bool case_sensitive_;
};

class NumericMatch : public NamedModule {
 public:
  NumericMatch(std::string name, double rel_tol, double abs_tol)
      : NamedModule(std::move(name)), rel_tol_(rel_tol), abs_tol_(abs_tol) {}
  Result<Score> score(const Task& task, const Rollout& r) override {
    auto expected = last_number(task.answer);
    if (!expected)
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("numeric_match: task '{}' answer '{}' has no number", task.id, task.answer));
    auto got = last_number(r.completion_text);
    Score s;
    s.metrics["parsed"] = got ? 1.0 : 0.0;
    if (got) {
      const double diff = std::fabs(*got - *expected);
      s.reward = diff <= std::max(abs_tol_, rel_tol_ * std::fabs(*expected)) ? 1.0 : 0.0;
    }
    return s;
  }

 private:
  double rel_tol_, abs_tol_;
};

class LcsRatio : public NamedModule {
 public:
  using NamedModule::NamedModule;
  Result<Score> score(const Task& task, const Rollout& r) override {
    const std::string a = trim(r.completion_text), b = trim(task.answer);
    if (a.empty() && b.empty()) return Score{1.0, {}};
    return Score{2.0 * static_cast<double>(lcs_length(a, b)) / static_cast<double>(a.size() + b.size()), {}};
  }
};

class RegexMatch : public NamedModule {
 public:
  RegexMatch(std::string name, std::regex re, bool compare_answer)
      : NamedModule(std::move(name)), re_(std::move(re)), compare_answer_(compare_answer) {}
  Result<Score> score(const Task& task, const Rollout& r) override {
    std::smatch m;
    const std::string& text = r.completion_text;
    if (!std::regex_search(text, m, re_)) return Score{0.0, {}};
    if (!compare_answer_) return Score{1.0, {}};
    const std::string captured = m.size() > 1 ? m[1].str() : m[0].str();
    return Score{trim(captured) == trim(task.answer) ? 1.0 : 0.0, {}};
  }

 private:
  std::regex re_;  // std::regex matching is const and safe to share across threads
  bool compare_answer_;
};

class LengthPenalty : public NamedModule {
 public:
  LengthPenalty(std::string name, double max_tokens, double free_tokens, double coef)
      : NamedModule(std::move(name)), max_(max_tokens), free_(free_tokens), coef_(coef) {}
  Result<Score> score(const Task&, const Rollout& r) override {
    const double n = static_cast<double>(r.completion_tokens.size());
    const double over = std::max(0.0, n - free_);
    const double span = std::max(1.0, max_ - free_);
    return Score{-coef_ * std::min(1.0, over / span), {{"tokens", n}}};
  }

 private:
  double max_, free_, coef_;
};

class Weighted : public NamedModule {
 public:
  Weighted(std::string name, std::vector<WeightedPart> parts) : NamedModule(std::move(name)), parts_(std::move(parts)) {
    for (const auto& p : parts_) groups_ = groups_ || p.module->scores_groups();
  }
  bool scores_groups() const override { return groups_; }
  Status usable() const override {
    for (const auto& p : parts_) ARLO_TRY(p.module->usable());
    return ok();
  }
  Result<Score> score(const Task& task, const Rollout& r) override {
    Score out;
    for (const auto& p : parts_) {
      auto s = p.module->score(task, r);
      if (!s) return std::unexpected(std::move(s).error().with_context(p.module->name()));
      add(out, p, *s);
    }
    return out;
  }
  Result<std::vector<Score>> score_group(const Task& task, std::span<const Rollout> group) override {
    std::vector<Score> out(group.size());
    for (const auto& p : parts_) {
      auto scores = p.module->score_group(task, group);
      if (!scores) return std::unexpected(std::move(scores).error().with_context(p.module->name()));
      if (scores->size() != group.size())
        return make_error(ErrorCode::kMismatch, fmt::format("{}: returned {} scores for a group of {}", p.module->name(),
                                                            scores->size(), group.size()));
      for (std::size_t i = 0; i < group.size(); ++i) add(out[i], p, (*scores)[i]);
    }
    return out;
  }

 private:
  static void add(Score& out, const WeightedPart& p, const Score& s) {
    out.reward += p.weight * s.reward;
    out.metrics[p.module->name()] = s.reward;
    for (const auto& [k, v] : s.metrics) out.metrics[p.module->name() + "/" + k] = v;
  }
  std::vector<WeightedPart> parts_;
  bool groups_ = false;
};

template <typename T>
Result<T> get_opt(const Json& spec, const char* key, T fallback) {
  if (!spec.contains(key)) return fallback;
  try {
    return spec.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("reward '{}': option '{}' has the wrong type ({})", spec.value("type", "?"), key,
                                  spec.at(key).dump()));
  }
}

Status check_keys(const Json& spec, std::initializer_list<const char*> allowed) {
  for (const auto& [k, v] : spec.items()) {
    if (k == "type" || k == "kind" || k == "name" || k == "weight") continue;
    if (std::find_if(allowed.begin(), allowed.end(), [&](const char* a) { return k == a; }) == allowed.end()) {
      std::string list;
      for (const char* a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("reward '{}': unknown option '{}' (known: type, name, weight{}{})",
                                    spec.value("type", "?"), k, list.empty() ? "" : ", ", list));
    }
  }
  return ok();
}

}  // namespace

std::unique_ptr<RewardModule> make_weighted(std::string name, std::vector<WeightedPart> parts) {
  return std::make_unique<Weighted>(std::move(name), std::move(parts));
}

namespace {

// Accepts the config schema's shape ({kind, weight, path, url, pattern, config: {...}}) as well as
// the flat one ({type, ...options}): "kind" means "type"; a built-in's options may sit in "config";
// generic keys left at their empty defaults are ignored.
Result<Json> normalize_spec(const Json& in) {
  if (!in.is_object()) return make_error(ErrorCode::kInvalidArgument, "reward spec: expected an object with 'kind' (or 'type')");
  Json spec = in;
  if (spec.contains("kind")) {
    if (spec.contains("type")) return make_error(ErrorCode::kInvalidArgument, "reward spec: give 'kind' or 'type', not both");
    spec["type"] = spec["kind"];
    spec.erase("kind");
  }
  if (!spec.contains("type") || !spec["type"].is_string())
    return make_error(ErrorCode::kInvalidArgument, "reward spec: needs a string 'kind' (exact_match, numeric_match, ...)");
  for (const char* key : {"path", "url", "pattern"})
    if (spec.contains(key) && spec[key].is_string() && spec[key].get<std::string>().empty()) spec.erase(key);
  const std::string type = spec["type"].get<std::string>();
  if (spec.contains("config") && type != "plugin") {
    const Json config = spec["config"];
    spec.erase("config");
    if (!config.is_object())
      return make_error(ErrorCode::kInvalidArgument, fmt::format("reward '{}': 'config' must be a mapping of options", type));
    for (const auto& [k, v] : config.items()) {
      if (spec.contains(k))
        return make_error(ErrorCode::kInvalidArgument, fmt::format("reward '{}': option '{}' given twice (in and out of config)", type, k));
      spec[k] = v;
    }
  }
  if (type == "plugin" && spec.contains("config") && spec["config"].is_object() && spec["config"].empty() &&
      !in.contains("type"))
    spec["config"] = "";  // the schema default {} means "no config"
  return spec;
}

}  // namespace

Result<std::unique_ptr<RewardModule>> make_reward_module(const Json& raw) {
  if (raw.is_array()) return make_reward_module(Json{{"type", "weighted"}, {"modules", raw}});
  ARLO_ASSIGN_OR_RETURN(const Json spec, normalize_spec(raw));
  const std::string type = spec["type"].get<std::string>();
  ARLO_ASSIGN_OR_RETURN(std::string name, get_opt<std::string>(spec, "name", type));

  if (type == "exact_match") {
    ARLO_TRY(check_keys(spec, {"case_sensitive"}));
    ARLO_ASSIGN_OR_RETURN(bool cs, get_opt<bool>(spec, "case_sensitive", true));
    return std::unique_ptr<RewardModule>(std::make_unique<ExactMatch>(name, cs));
  }
  if (type == "numeric_match") {
    ARLO_TRY(check_keys(spec, {"rel_tol", "abs_tol"}));
    ARLO_ASSIGN_OR_RETURN(double rel, get_opt<double>(spec, "rel_tol", 1e-6));
    ARLO_ASSIGN_OR_RETURN(double abs, get_opt<double>(spec, "abs_tol", 1e-9));
    return std::unique_ptr<RewardModule>(std::make_unique<NumericMatch>(name, rel, abs));
  }
  if (type == "lcs_ratio") {
    ARLO_TRY(check_keys(spec, {}));
    return std::unique_ptr<RewardModule>(std::make_unique<LcsRatio>(name));
  }
  if (type == "regex_match") {
    ARLO_TRY(check_keys(spec, {"pattern", "compare_answer"}));
    if (!spec.contains("pattern")) return make_error(ErrorCode::kInvalidArgument, "reward 'regex_match': needs 'pattern'");
    ARLO_ASSIGN_OR_RETURN(std::string pattern, get_opt<std::string>(spec, "pattern", ""));
    ARLO_ASSIGN_OR_RETURN(bool cmp, get_opt<bool>(spec, "compare_answer", false));
    try {
      return std::unique_ptr<RewardModule>(std::make_unique<RegexMatch>(name, std::regex(pattern), cmp));
    } catch (const std::regex_error& e) {
      return make_error(ErrorCode::kInvalidArgument, fmt::format("reward 'regex_match': bad pattern '{}': {}", pattern, e.what()));
    }
  }
  if (type == "length_penalty") {
    ARLO_TRY(check_keys(spec, {"max_tokens", "free_tokens", "coef"}));
    ARLO_ASSIGN_OR_RETURN(double max_tokens, get_opt<double>(spec, "max_tokens", 256.0));
    ARLO_ASSIGN_OR_RETURN(double free_tokens, get_opt<double>(spec, "free_tokens", 0.0));
    ARLO_ASSIGN_OR_RETURN(double coef, get_opt<double>(spec, "coef", 1.0));
    if (max_tokens <= free_tokens)
      return make_error(ErrorCode::kInvalidArgument, "reward 'length_penalty': max_tokens must exceed free_tokens");
    return std::unique_ptr<RewardModule>(std::make_unique<LengthPenalty>(name, max_tokens, free_tokens, coef));
  }
  if (type == "plugin") {
    ARLO_TRY(check_keys(spec, {"path", "config", "isolate", "timeout_s"}));
    ARLO_ASSIGN_OR_RETURN(std::string path, get_opt<std::string>(spec, "path", ""));
    if (path.empty()) return make_error(ErrorCode::kInvalidArgument, "reward 'plugin': needs 'path' to a shared library");
    std::string config;
    if (spec.contains("config")) config = spec["config"].is_string() ? spec["config"].get<std::string>() : spec["config"].dump();
    PluginOptions po;
    ARLO_ASSIGN_OR_RETURN(std::string isolate, get_opt<std::string>(spec, "isolate", "none"));
    ARLO_ASSIGN_OR_RETURN(po.isolate, parse_plugin_isolation(isolate));
    ARLO_ASSIGN_OR_RETURN(double t, get_opt<double>(spec, "timeout_s", 30.0));
    po.host.call_timeout = std::chrono::duration_cast<Duration>(std::chrono::duration<double>(t));
    return load_reward_plugin(path, config, spec.contains("name") ? std::optional<std::string>(name) : std::nullopt, po);
  }
  if (type == "http") {
    ARLO_TRY(check_keys(spec, {"url", "timeout_s", "group"}));
    HttpRewardOptions o;
    ARLO_ASSIGN_OR_RETURN(o.url, get_opt<std::string>(spec, "url", ""));
    if (o.url.empty()) return make_error(ErrorCode::kInvalidArgument, "reward 'http': needs 'url'");
    ARLO_ASSIGN_OR_RETURN(double t, get_opt<double>(spec, "timeout_s", 10.0));
    o.timeout = std::chrono::duration_cast<Duration>(std::chrono::duration<double>(t));
    ARLO_ASSIGN_OR_RETURN(o.group, get_opt<bool>(spec, "group", false));
    return make_http_reward(name, std::move(o));
  }
  if (type == "weighted") {
    ARLO_TRY(check_keys(spec, {"modules"}));
    if (!spec.contains("modules") || !spec["modules"].is_array() || spec["modules"].empty())
      return make_error(ErrorCode::kInvalidArgument, "reward 'weighted': needs a non-empty 'modules' list");
    std::vector<WeightedPart> parts;
    for (std::size_t i = 0; i < spec["modules"].size(); ++i) {
      const Json& sub = spec["modules"][i];
      auto m = make_reward_module(sub);
      if (!m) return std::unexpected(std::move(m).error().with_context(fmt::format("reward modules[{}]", i)));
      double w = 1.0;
      if (sub.is_object() && sub.contains("weight")) {
        if (!sub["weight"].is_number())
          return make_error(ErrorCode::kInvalidArgument, fmt::format("reward modules[{}]: 'weight' must be a number", i));
        w = sub["weight"].get<double>();
      }
      parts.push_back({std::move(*m), w});
    }
    return make_weighted(name, std::move(parts));
  }
  return make_error(ErrorCode::kInvalidArgument,
                    fmt::format("unknown reward type '{}': use exact_match, numeric_match, lcs_ratio, regex_match, "
                                "length_penalty, plugin, http or weighted",
                                type));
}

}  // namespace arlo::rollout
