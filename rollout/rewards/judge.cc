// judge: an LLM judge over any OpenAI-compatible server (rollout/rewards/judge.h).
#include "rollout/rewards/judge.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <condition_variable>
#include <cstdlib>
#include <list>
#include <mutex>
#include <regex>
#include <unordered_map>

namespace arlo::rollout::judge {

namespace asio = boost::asio;

namespace {

// The start of a judge's answer, for error messages.
std::string quoted(std::string_view text) {
  constexpr std::size_t kShown = 120;
  return fmt::format("'{}{}'", text.substr(0, kShown), text.size() > kShown ? "..." : "");
}

Result<double> scaled(const Parser& p, double v, std::string_view what) {
  if (!std::isfinite(v)) return make_error(ErrorCode::kParse, fmt::format("judge answer: {} is not finite", what));
  if (p.max_score <= 0) return v;
  return std::clamp(v / p.max_score, 0.0, 1.0);
}

// The JSON object in `text`: all of it, else from its first '{' to its last '}'.
std::optional<Json> json_in(std::string_view text) {
  Json j = Json::parse(text, nullptr, false);
  if (!j.is_discarded()) return j;
  const auto open = text.find('{'), close = text.rfind('}');
  if (open == std::string_view::npos || close == std::string_view::npos || close < open) return std::nullopt;
  j = Json::parse(text.substr(open, close - open + 1), nullptr, false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

Result<double> parse_json_field(const Parser& p, std::string_view text) {
  auto doc = json_in(text);
  if (!doc) return make_error(ErrorCode::kParse, fmt::format("judge answer holds no JSON object: {}", quoted(text)));
  const Json* at = &*doc;
  std::size_t start = 0;
  while (start <= p.field.size()) {
    const std::size_t dot = std::min(p.field.find('.', start), p.field.size());
    const std::string key = p.field.substr(start, dot - start);
    const bool index =
        !key.empty() && std::all_of(key.begin(), key.end(), [](unsigned char c) { return std::isdigit(c); });
    if (at->is_object() && at->contains(key)) {
      at = &(*at)[key];
    } else if (at->is_array() && index && std::stoul(key) < at->size()) {
      at = &(*at)[std::stoul(key)];
    } else {
      return make_error(ErrorCode::kParse,
                        fmt::format("judge answer has no field '{}' (at '{}'): {}", p.field, key, quoted(text)));
    }
    start = dot + 1;
  }
  if (at->is_boolean()) return at->get<bool>() ? 1.0 : 0.0;
  if (at->is_number()) return scaled(p, at->get<double>(), "field '" + p.field + "'");
  if (at->is_string()) {
    const std::string s = trim(at->get<std::string>());
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (!s.empty() && end && *end == '\0') return scaled(p, v, "field '" + p.field + "'");
  }
  return make_error(ErrorCode::kParse,
                    fmt::format("judge answer's field '{}' is not a number or boolean: {}", p.field, at->dump()));
}

Result<double> parse_yes_no(std::string_view text) {
  std::string word;
  for (char c : trim(text)) {
    if (!std::isalpha(static_cast<unsigned char>(c))) break;
    word.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  if (word == "yes") return 1.0;
  if (word == "no") return 0.0;
  return make_error(ErrorCode::kParse, fmt::format("judge answer is neither yes nor no: {}", quoted(text)));
}

Result<double> parse_regex(const Parser& p, std::string_view text) {
  std::regex re;
  try {
    re = std::regex(p.pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return make_error(ErrorCode::kInvalidArgument, fmt::format("judge pattern '{}': {}", p.pattern, e.what()));
  }
  std::match_results<std::string_view::const_iterator> m;
  if (!std::regex_search(text.begin(), text.end(), m, re) || m.size() < 2 || !m[1].matched)
    return make_error(ErrorCode::kParse,
                      fmt::format("judge answer does not match pattern '{}': {}", p.pattern, quoted(text)));
  const std::string captured = trim(m[1].str());
  char* end = nullptr;
  const double v = std::strtod(captured.c_str(), &end);
  if (captured.empty() || !end || *end != '\0')
    return make_error(ErrorCode::kParse, fmt::format("judge answer's capture '{}' is not a number", captured));
  return scaled(p, v, "the capture");
}

}  // namespace

std::optional<double> first_number(std::string_view text) {
  static const std::regex number(R"([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)");
  std::match_results<std::string_view::const_iterator> m;
  if (!std::regex_search(text.begin(), text.end(), m, number)) return std::nullopt;
  return std::strtod(m.str().c_str(), nullptr);
}

Result<Parser::Kind> parse_parser_kind(std::string_view name) {
  if (name == "number") return Parser::Kind::kNumber;
  if (name == "regex") return Parser::Kind::kRegex;
  if (name == "json") return Parser::Kind::kJson;
  if (name == "yes_no") return Parser::Kind::kYesNo;
  return make_error(ErrorCode::kInvalidArgument,
                    fmt::format("unknown judge parser '{}': use number, regex, json or yes_no", name));
}

Result<double> parse_answer(const Parser& parser, std::string_view text) {
  switch (parser.kind) {
    case Parser::Kind::kNumber: {
      auto v = first_number(text);
      if (!v) return make_error(ErrorCode::kParse, fmt::format("judge answer holds no number: {}", quoted(text)));
      return scaled(parser, *v, "the number");
    }
    case Parser::Kind::kRegex: return parse_regex(parser, text);
    case Parser::Kind::kJson: return parse_json_field(parser, text);
    case Parser::Kind::kYesNo: return parse_yes_no(text);
  }
  return make_error(ErrorCode::kInternal, "unknown parser");
}

// ------------------------------------------------------------------ template

Result<Template> Template::parse(std::string_view text) {
  Template t;
  std::string literal;
  bool completion = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if ((c == '{' || c == '}') && i + 1 < text.size() && text[i + 1] == c) {
      literal.push_back(c);
      ++i;
      continue;
    }
    if (c == '}') return make_error(ErrorCode::kInvalidArgument, "judge template: a lone '}' (write '}}' for a brace)");
    if (c != '{') {
      literal.push_back(c);
      continue;
    }
    const std::size_t close = text.find('}', i);
    if (close == std::string_view::npos)
      return make_error(ErrorCode::kInvalidArgument, "judge template: a '{' is never closed (write '{{' for a brace)");
    const std::string name(text.substr(i + 1, close - i - 1));
    const bool known = name == "prompt" || name == "answer" || name == "completion" ||
                       (name.rfind("info.", 0) == 0 && name.size() > 5);
    if (!known)
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("judge template: unknown placeholder {{{}}} (use {{prompt}}, {{answer}}, "
                                    "{{completion}} or {{info.<field>}})",
                                    name));
    completion = completion || name == "completion";
    if (!literal.empty()) t.pieces_.push_back({false, std::exchange(literal, {})});
    t.pieces_.push_back({true, name});
    i = close;
  }
  if (!literal.empty()) t.pieces_.push_back({false, literal});
  if (!completion)
    return make_error(ErrorCode::kInvalidArgument, "judge template: it never shows the judge the {completion}");
  return t;
}

Result<std::string> Template::render(const Task& task, std::string_view completion) const {
  std::string out;
  for (const auto& p : pieces_) {
    if (!p.placeholder) {
      out += p.text;
    } else if (p.text == "completion") {
      out += completion;
    } else if (p.text == "answer") {
      out += task.answer;
    } else if (p.text == "prompt") {
      out += task.prompt_text();
    } else {
      const std::string field = p.text.substr(5);
      if (!task.info.is_object() || !task.info.contains(field))
        return make_error(
            ErrorCode::kInvalidArgument,
            fmt::format("judge template: task '{}' has no info field '{}' for {{{}}}", task.id, field, p.text));
      const Json& v = task.info[field];
      out += v.is_string() ? v.get<std::string>() : v.dump();
    }
  }
  return out;
}

std::string check_template(const Json& value) {
  auto t = Template::parse(value.is_string() ? value.get<std::string>() : std::string());
  return t ? std::string() : t.error().message();
}

// ------------------------------------------------------------------ the call

asio::awaitable<Result<http::Response>> call_with_retries(http::Client& client, http::ClientRequest request,
                                                          RetryRule rule,
                                                          std::function<void(int, const std::string&)> on_retry) {
  constexpr Duration kMaxBackoff = std::chrono::seconds(8);
  request.timeout = rule.timeout;
  request.retry = http::RetryPolicy{1, {}, {}};  // the retries are this loop's, each with its own deadline
  Duration backoff = rule.backoff;
  for (int attempt = 1;; ++attempt) {
    auto r = co_await client.request(request);
    if (r && r->status >= 200 && r->status < 300) co_return r;
    ErrorCode code = ErrorCode::kUnavailable;
    std::string reason;
    bool again = false;
    if (!r) {
      code = r.error().code();
      reason = r.error().what();
      again = code == ErrorCode::kTimeout || code == ErrorCode::kUnavailable || code == ErrorCode::kIo;
    } else {
      reason = fmt::format("HTTP {}: {}", r->status, r->body.substr(0, 200));
      again = r->status == 429 || r->status >= 500;
      if (!again) code = ErrorCode::kInvalidArgument;
    }
    if (!again || attempt > rule.retries)
      co_return make_error(code,
                           fmt::format("judge server {}: {} attempt(s), the last: {}", request.url, attempt, reason));
    if (on_retry) on_retry(attempt, reason);
    asio::steady_timer wait(co_await asio::this_coro::executor, backoff);
    co_await wait.async_wait(asio::as_tuple(asio::use_awaitable));
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
}

std::string endpoint_url(std::string_view base, bool chat) {
  std::string url(base);
  while (!url.empty() && url.back() == '/') url.pop_back();
  auto ends_with = [&](std::string_view tail) {
    return url.size() >= tail.size() && url.compare(url.size() - tail.size(), tail.size(), tail) == 0;
  };
  if (ends_with("/completions")) return url;  // the endpoint itself
  if (!ends_with("/v1")) url += "/v1";
  return url + (chat ? "/chat/completions" : "/completions");
}

namespace {

// An LRU map of request -> answer text.
class Cache {
 public:
  explicit Cache(std::size_t capacity) : capacity_(capacity) {}
  std::optional<std::string> get(const std::string& key) {
    std::lock_guard lk(mu_);
    auto it = index_.find(key);
    if (it == index_.end()) return std::nullopt;
    order_.splice(order_.begin(), order_, it->second);
    return it->second->second;
  }
  void put(const std::string& key, std::string value) {
    if (capacity_ == 0) return;
    std::lock_guard lk(mu_);
    if (auto it = index_.find(key); it != index_.end()) {
      it->second->second = std::move(value);
      order_.splice(order_.begin(), order_, it->second);
      return;
    }
    order_.emplace_front(key, std::move(value));
    index_[key] = order_.begin();
    if (order_.size() > capacity_) {
      index_.erase(order_.back().first);
      order_.pop_back();
    }
  }

 private:
  std::size_t capacity_;
  std::mutex mu_;
  std::list<std::pair<std::string, std::string>> order_;  // most recent first
  std::unordered_map<std::string, std::list<std::pair<std::string, std::string>>::iterator> index_;
};

// The judge's answer text in an OpenAI completion or chat completion response.
Result<std::string> answer_text(const http::Response& resp, bool chat) {
  auto body = resp.parse_json();
  if (!body) return std::unexpected(std::move(body).error());
  const Json& j = *body;
  if (j.is_object() && j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()) {
    const Json& c = j["choices"][0];
    if (chat && c.contains("message") && c["message"].is_object() && c["message"].value("content", Json()).is_string())
      return c["message"]["content"].get<std::string>();
    if (!chat && c.value("text", Json()).is_string()) return c["text"].get<std::string>();
  }
  return make_error(ErrorCode::kParse,
                    fmt::format("judge server: no {} in the response: {}",
                                chat ? "choices[0].message.content" : "choices[0].text", resp.body.substr(0, 200)));
}

class Judge : public JudgeReward {
 public:
  Judge(std::string name, Options o, Template t)
      : JudgeReward(std::move(name)),
        options_(std::move(o)),
        template_(std::move(t)),
        url_(endpoint_url(options_.url, options_.chat)),
        cache_(options_.cache_size) {}

  Result<Score> score(const Task& task, const Rollout& r) override {
    ARLO_ASSIGN_OR_RETURN(std::string prompt, template_.render(task, r.text));
    const std::string body = request_body(prompt).dump();
    double cached = 1;
    auto text = cache_.get(body);
    if (text) {
      std::lock_guard lk(mu_);
      ++stats_.cache_hits;
    } else {
      cached = 0;
      ARLO_ASSIGN_OR_RETURN(text, call(body));
      cache_.put(body, *text);
    }
    auto reward = parse_answer(options_.parser, *text);
    if (!reward) return std::unexpected(std::move(reward).error().with_context(fmt::format("judge '{}'", name())));
    return Score{*reward, {{"cached", cached}}};
  }

  Stats stats() const override {
    std::lock_guard lk(mu_);
    return stats_;
  }

 private:
  Json request_body(const std::string& prompt) const {
    Json body = {{"model", options_.model}, {"temperature", options_.temperature}, {"max_tokens", options_.max_tokens}};
    if (options_.chat)
      body["messages"] = Json::array({{{"role", "user"}, {"content", prompt}}});
    else
      body["prompt"] = prompt;
    return body;
  }

  // One call to the server, within the concurrency cap; blocking on this (scorer worker) thread.
  Result<std::string> call(const std::string& body) {
    {
      std::unique_lock lk(mu_);
      ++stats_.waiting;
      slot_free_.wait(lk, [&] { return stats_.in_flight < options_.concurrency; });
      --stats_.waiting;
      ++stats_.in_flight;
      ++stats_.requests;
      stats_.max_in_flight = std::max(stats_.max_in_flight, stats_.in_flight);
    }
    auto [resp, attempts] = post(body);
    {
      std::lock_guard lk(mu_);
      --stats_.in_flight;
      stats_.attempts += static_cast<std::uint64_t>(attempts);
    }
    slot_free_.notify_one();
    if (!resp) return std::unexpected(std::move(resp).error().with_context(fmt::format("judge '{}'", name())));
    return answer_text(*resp, options_.chat);
  }

  std::pair<Result<http::Response>, int> post(const std::string& body) {
    asio::io_context io;
    http::ClientOptions copts;
    copts.token = options_.api_key;
    http::Client client(io, copts);
    http::ClientRequest req;
    req.method = http::Verb::post;
    req.url = url_;
    req.body = body;
    int attempts = 1;
    std::optional<Result<http::Response>> out;
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          out = co_await call_with_retries(client, std::move(req), options_.retry,
                                           [&](int, const std::string&) { ++attempts; });
        },
        asio::detached);
    io.run();
    if (!out) return {make_error(ErrorCode::kInternal, "the request did not complete"), attempts};
    return {std::move(*out), attempts};
  }

  Options options_;
  Template template_;
  std::string url_;
  Cache cache_;
  mutable std::mutex mu_;
  std::condition_variable slot_free_;
  Stats stats_;
};

}  // namespace

Result<std::unique_ptr<JudgeReward>> make_judge(std::string name, Options o) {
  const std::string who = fmt::format("reward '{}' (judge)", name);
  if (o.url.rfind("http://", 0) != 0)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("{}: url must start with http:// (arlo's HTTP client speaks plain HTTP; reach an "
                                  "https API through a local proxy), got '{}'",
                                  who, o.url));
  if (o.model.empty()) return make_error(ErrorCode::kInvalidArgument, who + ": needs 'model'");
  auto t = Template::parse(o.template_text);
  if (!t) return std::unexpected(std::move(t).error().with_context(who));
  if (o.parser.kind == Parser::Kind::kRegex) {
    std::string what = o.parser.pattern.empty() ? "parser regex needs a 'pattern' with a capture group" : "";
    try {
      if (what.empty() && std::regex(o.parser.pattern).mark_count() < 1) what = "'pattern' has no capture group";
    } catch (const std::regex_error& e) {
      what = fmt::format("'pattern' is not a valid regular expression: {}", e.what());
    }
    if (!what.empty()) return make_error(ErrorCode::kInvalidArgument, fmt::format("{}: {}", who, what));
  }
  if (o.parser.kind == Parser::Kind::kJson && o.parser.field.empty())
    return make_error(ErrorCode::kInvalidArgument, who + ": parser json needs a 'field' (a path such as score)");
  return std::unique_ptr<JudgeReward>(std::make_unique<Judge>(std::move(name), std::move(o), std::move(*t)));
}

}  // namespace arlo::rollout::judge

namespace arlo::rollout {

namespace {

Duration to_duration(const Json& v) {
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(v.get<double>()));
}

std::vector<OptionSpec> judge_options();

// The given options' bounds, choices and checks (resolve_options has checked their types).
Status check_given(const RewardSpec& s) {
  for (const auto& o : judge_options()) {
    if (!s.options.contains(o.key)) continue;
    if (const std::string what = check_option_value(o, s.options[o.key]); !what.empty())
      return make_error(ErrorCode::kInvalidArgument, fmt::format("reward '{}' (judge): {}: {}", s.name, o.key, what));
  }
  return ok();
}

Result<std::unique_ptr<RewardModule>> make(const RewardSpec& s) {
  ARLO_TRY(check_given(s));
  const Json& j = s.options;
  judge::Options o;
  o.url = j["url"].get<std::string>();
  o.model = j["model"].get<std::string>();
  if (const std::string env = j["api_key_env"].get<std::string>(); !env.empty()) {
    const char* key = std::getenv(env.c_str());
    if (!key || !*key)
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("reward '{}' (judge): api_key_env names {}, which is not set", s.name, env));
    o.api_key = key;
  }
  o.chat = j["endpoint"].get<std::string>() == "chat";
  o.template_text = j["template"].get<std::string>();
  o.temperature = j["temperature"].get<double>();
  o.max_tokens = j["max_tokens"].get<int>();
  ARLO_ASSIGN_OR_RETURN(o.parser.kind, judge::parse_parser_kind(j["parser"].get<std::string>()));
  o.parser.pattern = j["pattern"].get<std::string>();
  o.parser.field = j["field"].get<std::string>();
  o.parser.max_score = j["max_score"].get<double>();
  o.concurrency = std::max(1, j["concurrency"].get<int>());
  o.retry = {std::max(0, j["retries"].get<int>()), to_duration(j["timeout_s"]), to_duration(j["backoff_s"])};
  o.cache_size = static_cast<std::size_t>(std::max(0, j["cache_size"].get<int>()));
  ARLO_ASSIGN_OR_RETURN(auto module, judge::make_judge(s.name, std::move(o)));
  return std::unique_ptr<RewardModule>(std::move(module));
}

std::vector<OptionSpec> judge_options() {
  return {
      string_option("url", "", "URL of the judge's OpenAI-compatible server (http://host:port or .../v1).")
          .user_key()
          .must_be_given(),
      string_option("model", "", "the model name sent in each request (required)"),
      string_option("api_key_env", "", "name of an environment variable holding a bearer token"),
      string_option("endpoint", "chat", "chat (/v1/chat/completions) or completions (/v1/completions)")
          .one_of({"chat", "completions"}),
      string_option("template", "", "the prompt, over {prompt}, {answer}, {completion}, {info.<field>}")
          .checked_by(judge::check_template),
      float_option("temperature", 0.0, "sampling temperature").range(0, 2),
      int_option("max_tokens", 64, "most tokens of the judge's answer").range(1, 1 << 20),
      string_option("parser", "number", "number, regex, json or yes_no").one_of({"number", "regex", "json", "yes_no"}),
      string_option("pattern", "", "parser regex: its first capture group is the number"),
      string_option("field", "", "parser json: the field path (score, verdict.points)"),
      float_option("max_score", 0.0, "> 0 scales the number to [0, 1] (number / max_score)").range(0, 1e12),
      int_option("concurrency", 8, "most calls in flight at once").range(1, 4096),
      float_option("timeout_s", 10.0, "deadline of one attempt").range(0.001, 3600),
      int_option("retries", 2, "retries after a connection error, timeout, 429 or 5xx").range(0, 100),
      float_option("backoff_s", 0.5, "first wait before a retry (doubling, at most 8 s)").range(0, 60),
      int_option("cache_size", 4096, "answers kept, keyed by the exact request (0: no cache)").range(0, 1 << 24)};
}

}  // namespace

RewardKind judge_reward() {
  return {"judge", "an LLM judge on an OpenAI-compatible server", judge_options(), true, make};
}

}  // namespace arlo::rollout
