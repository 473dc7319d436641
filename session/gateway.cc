#include "session/gateway.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <optional>
#include <utility>

#include "common/auth.h"
#include "common/log.h"
#include "rollout/environment.h"
#include "rollout/openai.h"
#include "rollout/tool_calls.h"
#include "rollout/types.h"

namespace arlo::session {

namespace {

using json = nlohmann::json;
using SteadyTime = std::chrono::steady_clock::time_point;

constexpr std::string_view kChatPath = "/v1/chat/completions";
constexpr std::string_view kCompletionsPath = "/v1/completions";

// What is wrong with a call's body: the message and the field (OpenAI's "param").
struct BodyError {
  std::string message;
  std::string param;
};

std::optional<BodyError> parse_int(const json& body, const char* key, std::int64_t min, std::int64_t& out) {
  if (!body.contains(key) || body[key].is_null()) return std::nullopt;
  if (!body[key].is_number_integer() || body[key].get<std::int64_t>() < min)
    return BodyError{fmt::format("'{}' must be an integer >= {}", key, min), key};
  out = body[key].get<std::int64_t>();
  return std::nullopt;
}

std::optional<BodyError> parse_number(const json& body, const char* key, double min, double max, double& out) {
  if (!body.contains(key) || body[key].is_null()) return std::nullopt;
  if (!body[key].is_number() || body[key].get<double>() < min || body[key].get<double>() > max)
    return BodyError{fmt::format("'{}' must be a number in [{}, {}]", key, min, max), key};
  out = body[key].get<double>();
  return std::nullopt;
}

// The sampling fields of an OpenAI body over `s` (the run's sampling, the trajectory's seed).
std::optional<BodyError> parse_sampling(const json& body, SamplingParams& s) {
  if (body.contains("stream") && !body["stream"].is_null() && !body["stream"].is_boolean())
    return BodyError{"'stream' must be a boolean", "stream"};
  std::int64_t n = 1;
  if (auto e = parse_int(body, "n", 1, n)) return e;
  if (n != 1) return BodyError{"'n' must be 1: a trajectory takes one completion per call", "n"};
  if (auto e = parse_int(body, "max_tokens", 1, s.max_tokens)) return e;
  if (auto e = parse_int(body, "max_completion_tokens", 1, s.max_tokens)) return e;
  if (auto e = parse_number(body, "temperature", 0.0, 100.0, s.temperature)) return e;
  if (auto e = parse_number(body, "top_p", 1e-9, 1.0, s.top_p)) return e;
  std::int64_t seed = 0;
  if (auto e = parse_int(body, "seed", 0, seed)) return e;
  if (body.contains("seed") && body["seed"].is_number_integer()) s.seed = static_cast<std::uint64_t>(seed);
  if (body.contains("stop") && !body["stop"].is_null()) {
    const auto& stop = body["stop"];
    s.stop.clear();
    if (stop.is_string()) {
      s.stop.push_back(stop.get<std::string>());
    } else if (stop.is_array() && std::all_of(stop.begin(), stop.end(), [](const json& x) { return x.is_string(); })) {
      for (const auto& x : stop) s.stop.push_back(x.get<std::string>());
    } else {
      return BodyError{"'stop' must be a string or an array of strings", "stop"};
    }
  }
  return std::nullopt;
}

std::optional<BodyError> parse_messages(const json& body, std::vector<ChatMessage>& out) {
  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
    return BodyError{"'messages' must be a non-empty array of {role, content}", "messages"};
  const auto& messages = body["messages"];
  for (std::size_t i = 0; i < messages.size(); ++i) {
    auto m = chat_message_from_json(messages[i]);
    if (!m) return BodyError{fmt::format("messages[{}]: {}", i, m.error()), fmt::format("messages[{}]", i)};
    out.push_back(std::move(*m));
  }
  return std::nullopt;
}

// A chat call's "tools" (OpenAI function schemas, each naming a function) and "tool_choice" (a string
// or an object), passed to the worker as they are.
std::optional<BodyError> parse_tools(const json& body, rollout::CompletionRequest& cr) {
  if (body.contains("tools") && !body["tools"].is_null()) {
    if (auto names = rollout::tool_names(body["tools"]); !names) return BodyError{names.error().message(), "tools"};
    cr.tools = body["tools"];
  }
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    if (!body["tool_choice"].is_string() && !body["tool_choice"].is_object())
      return BodyError{"'tool_choice' must be a string or an object", "tool_choice"};
    cr.tool_choice = body["tool_choice"];
  }
  return std::nullopt;
}

std::optional<BodyError> parse_prompt(const json& body, rollout::CompletionRequest& cr) {
  const json prompt = body.value("prompt", json());
  if (prompt.is_string()) {
    cr.prompt = prompt.get<std::string>();
    return std::nullopt;
  }
  if (prompt.is_array() && prompt.size() == 1 && prompt[0].is_string()) {
    cr.prompt = prompt[0].get<std::string>();
    return std::nullopt;
  }
  if (prompt.is_array() && !prompt.empty()) {
    for (const auto& id : prompt) {
      if (!id.is_number_integer() || id.get<std::int64_t>() < 0 || id.get<std::int64_t>() > INT32_MAX)
        return BodyError{"'prompt' token ids must be integers in [0, 2^31)", "prompt"};
      cr.prompt_token_ids.push_back(id.get<std::int32_t>());
    }
    return std::nullopt;
  }
  return BodyError{"'prompt' must be a string or a non-empty array of token ids", "prompt"};
}

// What the program sees as finish_reason (OpenAI's: stop or length).
std::string_view finish_name(FinishReason r) { return r == FinishReason::kLength ? "length" : "stop"; }

// The OpenAI-shaped answer to one call, with the token ids (vLLM's return_token_ids fields) so that
// a program can keep token-in/token-out itself.
json response_body(bool chat, const rollout::Completion& c, const std::string& model, const std::string& id) {
  const auto& ch = c.choices.front();
  json choice = {{"index", 0}, {"finish_reason", finish_name(ch.finish_reason)}, {"token_ids", ch.token_ids}};
  if (chat) {
    choice["message"] = {{"role", "assistant"}, {"content", ch.text}};
    if (ch.tool_calls.is_array() && !ch.tool_calls.empty()) {  // the worker parsed calls: OpenAI's shape
      auto parsed = rollout::parse_tool_calls(ch.text, nullptr);
      const std::string rest = parsed ? parsed->content : ch.text;
      choice["message"]["content"] = rest.empty() ? json() : json(rest);
      choice["message"]["tool_calls"] = ch.tool_calls;
      choice["finish_reason"] = "tool_calls";
    }
    json content = json::array();
    for (float lp : ch.logprobs)
      content.push_back({{"token", ""}, {"logprob", lp}, {"bytes", nullptr}, {"top_logprobs", json::array()}});
    choice["logprobs"] = {{"content", std::move(content)}};
  } else {
    choice["text"] = ch.text;
    choice["logprobs"] = {{"token_logprobs", ch.logprobs}};
  }
  const auto prompt_n = c.prompt_token_ids.size();
  const auto completion_n = ch.token_ids.size();
  return {
      {"id", fmt::format("arlo-{}", id)},
      {"object", chat ? "chat.completion" : "text_completion"},
      {"created", static_cast<std::int64_t>(std::time(nullptr))},
      {"model", model.empty() ? c.model : model},
      {"choices", json::array({std::move(choice)})},
      {"prompt_token_ids", c.prompt_token_ids},
      {"usage",
       {{"prompt_tokens", prompt_n}, {"completion_tokens", completion_n}, {"total_tokens", prompt_n + completion_n}}}};
}

// A whole answer as the server-sent events of a stream (`stream: true`; verifiers' chat programs
// always stream): one chunk with the message (its tool calls indexed), one with the finish reason,
// one with the usage, then [DONE]. The call is recorded whole like any other; only the framing differs.
std::string stream_body(bool chat, json whole) {
  std::string out;
  auto event = [&](json choices, json usage) {
    json chunk = {{"id", whole["id"]},
                  {"object", chat ? "chat.completion.chunk" : "text_completion"},
                  {"created", whole["created"]},
                  {"model", whole["model"]},
                  {"choices", std::move(choices)}};
    if (!usage.is_null()) chunk["usage"] = std::move(usage);
    out += "data: " + chunk.dump() + "\n\n";
  };
  json& choice = whole["choices"][0];
  const json finish = choice["finish_reason"];
  if (chat) {
    json delta = {{"role", "assistant"}, {"content", choice["message"]["content"]}};
    if (choice["message"].contains("tool_calls")) {
      delta["tool_calls"] = choice["message"]["tool_calls"];
      for (std::size_t i = 0; i < delta["tool_calls"].size(); ++i) delta["tool_calls"][i]["index"] = i;
    }
    event(json::array({{{"index", 0},
                        {"delta", std::move(delta)},
                        {"finish_reason", nullptr},
                        {"token_ids", choice["token_ids"]}}}),
          nullptr);
    event(json::array({{{"index", 0}, {"delta", json::object()}, {"finish_reason", finish}}}), nullptr);
  } else {
    event(
        json::array(
            {{{"index", 0}, {"text", choice["text"]}, {"finish_reason", finish}, {"token_ids", choice["token_ids"]}}}),
        nullptr);
  }
  event(json::array(), whole["usage"]);
  return out + "data: [DONE]\n\n";
}

// Appends `more` (a continuation of `into`'s only choice) to it, its versions shifted to follow.
void append_continuation(rollout::CompletionChoice& into, rollout::CompletionChoice& more) {
  const auto offset = static_cast<std::int64_t>(into.token_ids.size());
  for (auto span : more.version_spans) {
    span.first_token += offset;
    if (into.version_spans.empty() || into.version_spans.back().version != span.version)
      into.version_spans.push_back(span);
  }
  into.logprobs.resize(into.token_ids.size(), 0.0F);
  into.token_ids.insert(into.token_ids.end(), more.token_ids.begin(), more.token_ids.end());
  into.logprobs.insert(into.logprobs.end(), more.logprobs.begin(), more.logprobs.end());
  into.text += more.text;
  into.finish_reason = more.finish_reason;
}

// One call through the pool, continued from its tokens while a weight update aborts it, so the
// program gets one answer. Checked for the token data training needs.
Awaitable<Result<rollout::Completion>> submit_whole(rollout::InferencePool& pool, rollout::CompletionRequest cr,
                                                    SteadyTime deadline, rollout::AdminDialect server) {
  const bool chat = cr.is_chat();
  auto budget = [deadline] {
    return std::max<http::Duration>(http::Duration::zero(), deadline - SteadyTime::clock::now());
  };
  auto first = co_await pool.submit(cr, budget());
  if (!first) co_return first;
  if (auto st = rollout::check_token_data(*first, chat, true, server); !st) co_return std::unexpected(st.error());
  if (first->choices.size() != 1)
    co_return make_error(ErrorCode::kMismatch, "the server answered other than one choice");
  auto& choice = first->choices.front();
  for (int round = 1; choice.finish_reason == FinishReason::kAbort; ++round) {
    const auto left = cr.sampling.max_tokens - static_cast<std::int64_t>(choice.token_ids.size());
    if (left <= 0) {
      choice.finish_reason = FinishReason::kLength;
      break;
    }
    rollout::CompletionRequest next;
    next.model = cr.model;
    next.prompt_token_ids = first->prompt_token_ids;
    next.prompt_token_ids.insert(next.prompt_token_ids.end(), choice.token_ids.begin(), choice.token_ids.end());
    next.sampling = cr.sampling;
    next.sampling.max_tokens = left;
    if (next.sampling.seed) next.sampling.seed = *next.sampling.seed + static_cast<std::uint64_t>(round);
    next.affinity_key = cr.affinity_key;
    next.extra = rollout::token_data_request(server, false);
    next.cache_salt = cr.cache_salt;
    auto more = co_await pool.submit(std::move(next), budget());
    if (!more) co_return std::unexpected(std::move(more).error());
    if (auto st = rollout::check_token_data(*more, false, true, server); !st) co_return std::unexpected(st.error());
    append_continuation(choice, more->choices.front());
  }
  co_return first;
}

// Each trajectory in flight holds about three descriptors in this process: its request to the agent
// program (open while the program runs), the program's connection to the gateway and the pool's to a
// worker; the rest of the process gets a margin.
Status check_open_files(std::size_t inflight) {
  auto limit = http::raise_open_file_limit();
  if (!limit) return std::unexpected(limit.error());
  const std::uint64_t need = 3 * static_cast<std::uint64_t>(inflight) + 256;
  if (*limit >= need) return ok();
  return make_error(ErrorCode::kResourceExhausted,
                    fmt::format("policy gateway: {} trajectories in flight (orchestrator.max_inflight) hold about {} "
                                "open files, but this process may open {} (RLIMIT_NOFILE, already raised to its hard "
                                "limit): raise the hard limit (ulimit -Hn, LimitNOFILE) or lower max_inflight",
                                inflight, need, *limit));
}

}  // namespace

struct Gateway::Trajectory {
  std::string id;
  Sample sample;                           // grows by each call: the ids its prompt adds, then the completion
  std::vector<std::int32_t> first_prompt;  // the first call's prompt ids
  std::vector<std::int32_t> ids;           // first_prompt + sample.completion_tokens: what a call must extend
  SteadyTime deadline;
  SamplingParams sampling;  // the run's; a call's own fields override it
  std::uint64_t seed = 0;
  int calls = 0;
  bool busy = false;          // a call is in flight (calls of one trajectory are sequential)
  bool ended = false;         // a call rewrote history: the trajectory keeps what it has, takes no more calls
  bool last_stopped = false;  // the last call ended on a stop token (which the next prompt may leave out)
  std::uint64_t stop_tokens_dropped = 0;
  std::size_t chat_messages = 0;  // messages of the last chat call (the turns after it are new)
  std::string completion_text;    // completions: the last prompt and its answer (the text a next prompt extends)

  // Records one answered call; false (nothing recorded) when `prompt` does not extend the trajectory.
  bool record(const std::vector<std::int32_t>& prompt, rollout::CompletionChoice& ch, const std::string& worker) {
    if (calls == 0) {
      first_prompt = prompt;
      ids = prompt;
    } else if (!extends(prompt, ids.size())) {
      // A chat template (arlo-worker's) or a text prompt does not render the token that ended the
      // last turn (<eos>): the model saw the prompt without it, so the trajectory drops it too.
      if (!(last_stopped && !ids.empty() && extends(prompt, ids.size() - 1))) return false;
      ids.pop_back();
      sample.completion_tokens.pop_back();
      sample.logprobs.pop_back();
      sample.loss_mask.pop_back();
      ++stop_tokens_dropped;
    }
    auto& s = sample;
    for (std::size_t i = ids.size(); i < prompt.size(); ++i) {  // what the program added: not the model's
      s.completion_tokens.push_back(prompt[i]);
      s.logprobs.push_back(0.0F);
      s.loss_mask.push_back(0);
    }
    const auto offset = static_cast<std::int64_t>(s.completion_tokens.size());
    for (auto span : ch.version_spans) {
      span.first_token = s.version_spans.empty() ? 0 : span.first_token + offset;
      if (s.version_spans.empty() || s.version_spans.back().version != span.version) s.version_spans.push_back(span);
    }
    s.turn_versions.push_back(ch.version_spans.empty() ? kNoVersion : ch.version_spans.front().version);
    ch.logprobs.resize(ch.token_ids.size(), 0.0F);
    s.completion_tokens.insert(s.completion_tokens.end(), ch.token_ids.begin(), ch.token_ids.end());
    s.logprobs.insert(s.logprobs.end(), ch.logprobs.begin(), ch.logprobs.end());
    s.loss_mask.resize(s.completion_tokens.size(), 1);
    ids = prompt;
    ids.insert(ids.end(), ch.token_ids.begin(), ch.token_ids.end());
    s.text = ch.text;
    s.finish_reason = ch.finish_reason;
    s.worker = worker;
    last_stopped = ch.finish_reason == FinishReason::kStop && !ch.token_ids.empty();
    ++calls;
    return true;
  }

  // Whether `prompt` starts with the trajectory's first `n` ids.
  bool extends(const std::vector<std::int32_t>& prompt, std::size_t n) const {
    return prompt.size() >= n && std::equal(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n), prompt.begin());
  }

  // The turns a recorded call adds (Sample::turns): the messages the program added since the last
  // call (after the model's reply to it), then the model's reply.
  void note_turns(const rollout::CompletionRequest& cr, const std::string& text) {
    auto& turns = sample.turns;
    if (cr.is_chat()) {
      if (calls > 1)
        for (std::size_t i = chat_messages + 1; i < cr.messages.size(); ++i) turns.push_back(cr.messages[i]);
      chat_messages = cr.messages.size();
    } else if (cr.prompt) {
      if (calls > 1 && cr.prompt->size() > completion_text.size() && cr.prompt->starts_with(completion_text))
        turns.push_back({"user", cr.prompt->substr(completion_text.size())});
      completion_text = *cr.prompt + text;
    }
    turns.push_back({"assistant", text});
  }
};

namespace {

// Whether environment kind `kind`'s tasks run through the gateway (EnvironmentKind::via_gateway).
bool kind_via_gateway(const std::string& kind) {
  auto k = rollout::find_environment_kind(kind);
  return k && (*k)->via_gateway;
}

}  // namespace

bool gateway_enabled(const config::Config& cfg) {
  if (cfg.boolean("gateway.enabled") || !cfg.string("gateway.agent_url").empty()) return true;
  // A kind whose program calls the model through it: the run's (env.kind, or each env.sources item's)
  // or eval's.
  const auto& sources = cfg.objects("env.sources");
  if (sources.empty() && kind_via_gateway(cfg.string("env.kind"))) return true;
  if (std::ranges::any_of(sources, [](const config::Config& s) { return kind_via_gateway(s.string("kind")); }))
    return true;
  const auto& eval_kind = cfg.string("eval.env_kind");
  return cfg.integer("eval.interval") > 0 && eval_kind != "same" && kind_via_gateway(eval_kind);
}

GatewayOptions gateway_options(const config::Config& cfg) {
  GatewayOptions o;
  o.bind = cfg.string("gateway.bind");
  o.port = static_cast<std::uint16_t>(cfg.integer("gateway.port"));
  o.agent_url = cfg.string("gateway.agent_url");
  o.envs = cfg.strings("gateway.envs");
  o.agent_timeout = std::chrono::milliseconds(std::llround(1000 * cfg.number("gateway.agent_timeout_s")));
  o.call_timeout = std::chrono::milliseconds(std::llround(1000 * cfg.number("gateway.call_timeout_s")));
  o.max_inflight = static_cast<std::size_t>(std::max<std::int64_t>(1, cfg.integer("orchestrator.max_inflight")));
  return o;
}

Gateway::Gateway(boost::asio::io_context& io, rollout::InferencePool& pool, GatewayOptions options)
    : io_(io),
      pool_(pool),
      options_(std::move(options)),
      server_(io,
              [this] {
                http::ServerOptions so;
                so.bind = options_.bind;
                so.port = options_.port;
                so.token = options_.token;
                so.max_body_bytes = options_.max_body_bytes;
                so.server_name = "arlo-gateway";
                return so;
              }()),
      client_(io, [this] {
        http::ClientOptions co;
        co.token = options_.token;
        co.retry.max_attempts = 1;
        co.max_idle_per_host = options_.max_inflight;  // else each trajectory past it opens a connection
        return co;
      }()) {
  auto route = [this](bool chat) {
    return [this, chat](http::Request r) -> Awaitable<http::Response> {
      auto op = handle(std::move(r), chat);
      co_return co_await std::move(op);
    };
  };
  server_.route(http::Verb::post, std::string(kChatPath), route(true));
  server_.route(http::Verb::post, std::string(kCompletionsPath), route(false));
  server_.route(http::Verb::post, "/t/*", route(false));  // chat or not: by the path's end (handle)
}

Gateway::~Gateway() { server_.close(); }

Result<std::uint16_t> Gateway::start() {
  ARLO_TRY(auth::require_token_off_loopback("policy gateway", options_.bind, options_.token));
  ARLO_TRY(check_open_files(options_.max_inflight));
  return server_.start();
}

void Gateway::close() { server_.close(); }

std::uint16_t Gateway::port() const { return server_.port(); }

std::string Gateway::url() const {
  const bool any = options_.bind == "0.0.0.0" || options_.bind == "::" || options_.bind.empty();
  const std::string host = any ? "127.0.0.1" : options_.bind;
  return fmt::format("http://{}:{}", host.find(':') != std::string::npos ? "[" + host + "]" : host, port());
}

const Gateway::Program* Gateway::program_for(const Task& task) const {
  const auto it = programs_.find(task.env);
  return it != programs_.end() && it->second ? &it->second : nullptr;
}

bool Gateway::handles(const Task& task) const {
  if (program_for(task)) return true;
  if (options_.agent_url.empty()) return false;
  return options_.envs.empty() ||
         std::find(options_.envs.begin(), options_.envs.end(), task.env) != options_.envs.end();
}

void Gateway::count(std::uint64_t& field, std::uint64_t n) {
  field += n;
  if (!registry_ || n == 0) return;
  static constexpr std::pair<std::uint64_t GatewayStats::*, const char*> kNames[] = {
      {&GatewayStats::trajectories, "trajectories"},
      {&GatewayStats::calls, "calls"},
      {&GatewayStats::unknown_trajectory, "unknown_trajectory"},
      {&GatewayStats::closed_trajectory, "closed_trajectory"},
      {&GatewayStats::malformed, "malformed"},
      {&GatewayStats::busy, "busy"},
      {&GatewayStats::rewrites, "rewrites"},
      {&GatewayStats::stop_tokens_dropped, "stop_tokens_dropped"},
      {&GatewayStats::call_failures, "call_failures"},
      {&GatewayStats::call_timeouts, "call_timeouts"},
      {&GatewayStats::agent_failures, "agent_failures"},
  };
  for (const auto& [member, name] : kNames)
    if (&(stats_.*member) == &field)
      registry_->counter(fmt::format("gateway/{}", name), "policy gateway (docs/environments.md)")
          .inc(static_cast<double>(n));
}

http::Response Gateway::refuse(std::uint64_t& counter, int status, std::string message, std::string param) {
  count(counter);
  ARLO_WARN_EVERY(5.0, "policy gateway: {} ({})", message, status);
  const char* type = status == 404   ? "not_found_error"
                     : status == 409 ? "conflict_error"
                     : status == 504 ? "timeout_error"
                     : status == 502 ? "server_error"
                                     : "invalid_request_error";
  return http::Response::error(status, std::move(message), type, std::move(param));
}

Awaitable<http::Response> Gateway::handle(http::Request request, bool chat) {
  std::string id;
  if (request.path.starts_with("/t/")) {  // the per-trajectory base URL: /t/<id>/v1/...
    const auto slash = request.path.find('/', 3);
    const std::string rest = slash == std::string::npos ? "" : request.path.substr(slash);
    if (rest != kChatPath && rest != kCompletionsPath)
      co_return http::Response::error(404, fmt::format("no route for {}", request.path), "not_found_error");
    id = request.path.substr(3, slash - 3);
    chat = rest == kChatPath;
  } else if (auto h = request.headers.find("x-arlo-trajectory"); h != request.headers.end()) {
    id = h->second;
  } else if (auto q = request.query_param("trajectory")) {
    id = *q;
  }
  if (id.empty())
    co_return refuse(stats_.unknown_trajectory, 400,
                     "name the trajectory: call <base_url>/t/<id>/v1/..., or send the header X-Arlo-Trajectory",
                     "trajectory");
  auto op = call(std::move(id), std::move(request), chat);
  co_return co_await std::move(op);
}

Awaitable<http::Response> Gateway::call(std::string id, http::Request request, bool chat) {
  auto it = open_.find(id);
  if (it == open_.end()) {
    if (closed_.count(id))
      co_return refuse(stats_.closed_trajectory, 409, fmt::format("trajectory {} has ended", id), "trajectory");
    co_return refuse(stats_.unknown_trajectory, 404, fmt::format("no trajectory {}", id), "trajectory");
  }
  Trajectory& t = *it->second;
  if (t.ended)
    co_return refuse(stats_.closed_trajectory, 409,
                     fmt::format("trajectory {} has ended: a call rewrote its history", id), "trajectory");
  if (t.busy)
    co_return refuse(stats_.busy, 409, fmt::format("trajectory {} has a call in flight: calls are sequential", id),
                     "trajectory");
  auto body = request.json();
  if (!body || !body->is_object())
    co_return refuse(stats_.malformed, 400, body ? "the body must be a JSON object" : body.error().what(), "body");
  rollout::CompletionRequest cr;
  cr.model = options_.model;
  cr.sampling = t.sampling;
  cr.sampling.seed = t.seed + static_cast<std::uint64_t>(t.calls);
  auto bad = chat ? parse_messages(*body, cr.messages) : parse_prompt(*body, cr);
  if (!bad && chat) bad = parse_tools(*body, cr);
  if (!bad) bad = parse_sampling(*body, cr.sampling);
  if (bad) co_return refuse(stats_.malformed, 400, std::move(bad->message), std::move(bad->param));
  const json stream_field = body->value("stream", json(false));
  const bool stream = stream_field.is_boolean() && stream_field.get<bool>();
  cr.sampling.n = 1;
  cr.sampling.logprobs = true;
  cr.affinity_key = id;  // one worker per trajectory while it is up: its prefix cache
  cr.extra = rollout::token_data_request(options_.server, cr.is_chat());
  cr.cache_salt = options_.server == rollout::AdminDialect::kVllm || options_.server == rollout::AdminDialect::kSglang;
  t.busy = true;
  const auto call_deadline = options_.call_timeout.count() > 0
                                 ? std::min(t.deadline, SteadyTime::clock::now() + options_.call_timeout)
                                 : t.deadline;
  auto op = submit_whole(pool_, cr, call_deadline, options_.server);
  auto done = co_await std::move(op);
  it = open_.find(id);  // the program's answer may have closed it meanwhile
  if (it == open_.end())
    co_return refuse(stats_.closed_trajectory, 409, fmt::format("trajectory {} ended during the call", id),
                     "trajectory");
  Trajectory& now = *it->second;
  now.busy = false;
  if (!done && done.error().code() == ErrorCode::kTimeout && call_deadline < now.deadline)
    co_return refuse(stats_.call_timeouts, 504,
                     fmt::format("trajectory {}: the model call took longer than gateway.call_timeout_s ({} s) and "
                                 "was dropped; the trajectory goes on",
                                 id, std::chrono::duration<double>(options_.call_timeout).count()),
                     "trajectory");
  if (!done) {
    const int status = done.error().code() == ErrorCode::kTimeout ? 504 : 502;
    co_return refuse(stats_.call_failures, status, done.error().what(), "model");
  }
  const auto dropped = now.stop_tokens_dropped;
  const bool recorded = now.record(done->prompt_token_ids, done->choices.front(), done->worker);
  count(stats_.stop_tokens_dropped, now.stop_tokens_dropped - dropped);
  if (!recorded) {
    now.ended = true;
    co_return refuse(stats_.rewrites, 409,
                     fmt::format("trajectory {}: the prompt does not extend the trajectory's tokens (history was "
                                 "rewritten); the trajectory ends here",
                                 id),
                     chat ? "messages" : "prompt");
  }
  now.note_turns(cr, done->choices.front().text);
  count(stats_.calls);
  auto answer = response_body(chat, *done, options_.model, fmt::format("{}-{}", id, now.calls));
  if (stream) co_return http::Response::text(200, stream_body(chat, std::move(answer)), "text/event-stream");
  co_return http::Response::json(200, std::move(answer));
}

Awaitable<Result<double>> Gateway::ask_agent(std::shared_ptr<const Task> task, std::string id, SteadyTime deadline,
                                             SamplingParams sampling) {
  json body = {
      {"task", rollout::to_json(*task)},
      {"trajectory", id},
      {"base_url", fmt::format("{}/t/{}/v1", url(), id)},
      {"gateway_url", url() + "/v1"},
      {"headers", {{"X-Arlo-Trajectory", id}}},
      {"api_key", options_.token.empty() ? "none" : options_.token},
      {"sampling",
       {{"temperature", sampling.temperature}, {"top_p", sampling.top_p}, {"max_tokens", sampling.max_tokens}}}};
  if (const Program* program = program_for(*task)) {
    auto op = (*program)(std::move(body), deadline);
    co_return co_await std::move(op);
  }
  http::ClientRequest r;
  r.method = http::Verb::post;
  r.url = options_.agent_url;
  r.body = body.dump();
  r.timeout = std::max<http::Duration>(std::chrono::milliseconds(1), deadline - SteadyTime::clock::now());
  auto op = client_.request(std::move(r));
  auto answer = co_await std::move(op);
  const auto where = fmt::format("agent program at {} (trajectory {})", options_.agent_url, id);
  if (!answer) co_return make_error(answer.error().code(), fmt::format("{}: {}", where, answer.error().what()));
  if (answer->status != 200)
    co_return make_error(ErrorCode::kUnavailable,
                         fmt::format("{} answered HTTP {}: {}", where, answer->status, answer->body.substr(0, 200)));
  auto j = answer->parse_json();
  if (!j || !j->is_object() || !j->contains("reward") || !(*j)["reward"].is_number() ||
      !std::isfinite((*j)["reward"].get<double>()))
    co_return make_error(ErrorCode::kParse,
                         fmt::format("{} answered no finite number 'reward': {}", where, answer->body.substr(0, 200)));
  co_return (*j)["reward"].get<double>();
}

void Gateway::forget(const std::string& id) {
  open_.erase(id);
  closed_.insert(id);
  closed_order_.push_back(id);
  while (closed_order_.size() > options_.remember_closed) {
    closed_.erase(closed_order_.front());
    closed_order_.pop_front();
  }
}

namespace {

// The group's samples: the prompt every trajectory's first call shares is the group's prompt; the
// rest of each one's first prompt opens its completion (loss mask 0).
Result<orch::GenerateResult> assemble(std::vector<std::unique_ptr<Gateway::Trajectory>>& ts,
                                      const std::vector<Result<double>>& rewards);

}  // namespace

Awaitable<Result<orch::GenerateResult>> Gateway::run(orch::GenerateRequest request) {
  const auto deadline =
      request.deadline == orch::TimePoint{} ? SteadyTime::clock::now() + options_.agent_timeout : request.deadline;
  std::vector<std::string> ids;
  std::vector<Awaitable<Result<double>>> asks;
  for (int i = 0; i < request.n; ++i) {
    auto t = std::make_unique<Trajectory>();
    t->id = fmt::format("{}-{}-{}", request.group_id, i, next_id_++);
    t->deadline = deadline;
    t->sampling = request.sampling;
    t->seed = request.seed + 1000003ULL * static_cast<std::uint64_t>(i);
    t->sample.task_id = request.task->id;
    t->sample.sample_index = i;
    ids.push_back(t->id);
    asks.push_back(ask_agent(request.task, t->id, deadline, request.sampling));
    open_.emplace(t->id, std::move(t));
  }
  count(stats_.trajectories, ids.size());
  auto all = when_all(std::move(asks));
  auto rewards = co_await std::move(all);
  std::vector<std::unique_ptr<Trajectory>> done;
  for (const auto& id : ids) {
    done.push_back(std::move(open_.at(id)));
    forget(id);
  }
  for (const auto& r : rewards)
    if (!r) count(stats_.agent_failures);
  co_return assemble(done, rewards);
}

namespace {

Result<orch::GenerateResult> assemble(std::vector<std::unique_ptr<Gateway::Trajectory>>& ts,
                                      const std::vector<Result<double>>& rewards) {
  for (const auto& r : rewards)
    if (!r) return std::unexpected(r.error());
  for (const auto& t : ts)
    if (t->calls == 0)
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("trajectory {}: the agent program answered a reward without a model call through "
                                    "the gateway",
                                    t->id));
  std::size_t common = ts.front()->first_prompt.size();
  for (const auto& t : ts) {
    const auto& p = t->first_prompt;
    const auto& q = ts.front()->first_prompt;
    common = std::min(
        common, static_cast<std::size_t>(std::mismatch(p.begin(), p.end(), q.begin(), q.end()).first - p.begin()));
  }
  orch::GenerateResult out;
  out.prompt_tokens.assign(ts.front()->first_prompt.begin(),
                           ts.front()->first_prompt.begin() + static_cast<std::ptrdiff_t>(common));
  out.worker = ts.front()->sample.worker;
  for (std::size_t i = 0; i < ts.size(); ++i) {
    Sample s = std::move(ts[i]->sample);
    const auto& p = ts[i]->first_prompt;
    const auto extra = static_cast<std::ptrdiff_t>(p.size() - common);
    s.completion_tokens.insert(s.completion_tokens.begin(), p.begin() + static_cast<std::ptrdiff_t>(common), p.end());
    s.logprobs.insert(s.logprobs.begin(), static_cast<std::size_t>(extra), 0.0F);
    s.loss_mask.insert(s.loss_mask.begin(), static_cast<std::size_t>(extra), 0);
    for (std::size_t k = 1; k < s.version_spans.size(); ++k) s.version_spans[k].first_token += extra;
    s.env_reward = *rewards[i];
    out.completions.push_back(std::move(s));
  }
  return out;
}

}  // namespace

}  // namespace arlo::session
