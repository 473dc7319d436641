#include "rollout/multi_turn.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/this_coro.hpp>

#include <cmath>

#include <fmt/format.h>

#include "common/http.h"
#include "common/utf8.h"
#include "rollout/tool_calls.h"

namespace arlo::rollout {
namespace {

namespace asio = boost::asio;

// The start of a body for an error message, in printable ASCII (a message may end up in JSON).
std::string excerpt(std::string_view body) {
  std::string out(body.substr(0, 120));
  for (char& c : out)
    if (c < 0x20 || c > 0x7e) c = '?';
  return body.size() > out.size() ? out + "..." : out;
}

std::unexpected<Error> parse_error(EnvCall call, const std::string& what) {
  return make_error(ErrorCode::kParse, fmt::format("environment {} reply: {}", to_string(call), what));
}

Result<std::vector<ChatMessage>> parse_messages(const Json& body, EnvCall call) {
  std::vector<ChatMessage> out;
  if (!body.contains("messages") || body["messages"].is_null()) return out;
  const Json& messages = body["messages"];
  if (!messages.is_array()) return parse_error(call, "'messages' must be an array");
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const Json& m = messages[i];
    const std::string field = fmt::format("messages[{}]", i);
    // OpenAI's form allows a null content (a message of tool calls only): it adds no text.
    auto parsed = chat_message_from_json(m);
    if (!parsed) return parse_error(call, field + ": " + parsed.error());
    ChatMessage msg = std::move(*parsed);
    if (!valid_utf8(msg.role)) return parse_error(call, field + ".role is not valid UTF-8");
    if (!valid_utf8(msg.content)) return parse_error(call, field + ".content is not valid UTF-8");
    out.push_back(std::move(msg));
  }
  return out;
}

Status parse_done_and_reward(const Json& body, EnvCall call, EnvTurn& turn) {
  const bool has_done = body.contains("done") && !body["done"].is_null();
  if (has_done && !body["done"].is_boolean()) return parse_error(call, "'done' must be true or false");
  if (call == EnvCall::kStep && !has_done) return parse_error(call, "'done' (true or false) is missing");
  turn.done = has_done && body["done"].get<bool>();
  if (call == EnvCall::kReset && turn.done)
    return parse_error(call, "'done' must be false (a reset starts a trajectory)");
  if (body.contains("reward") && !body["reward"].is_null()) {
    if (!body["reward"].is_number() || !std::isfinite(body["reward"].get<double>()))
      return parse_error(call, "'reward' must be a finite number or null");
    if (call == EnvCall::kReset) return parse_error(call, "'reward' is not allowed (nothing was generated yet)");
    turn.reward = body["reward"].get<double>();
  }
  return ok();
}

// The http kind's client: one POST per call, bounded by the call's deadline, no retry (a step is not
// idempotent for a stateful server).
class HttpEnvironment : public MultiTurnEnvironment {
 public:
  explicit HttpEnvironment(HttpEnvironmentOptions o) : options_(std::move(o)) {
    while (!options_.url.empty() && options_.url.back() == '/') options_.url.pop_back();
  }

  Awaitable<Result<EnvTurn>> reset(const Task& task, Deadline deadline) override {
    co_return co_await call(EnvCall::kReset, env_request_json(task), deadline);
  }
  Awaitable<Result<EnvTurn>> step(const Task& task, const Json& state, const std::vector<ChatMessage>& turns,
                                  Deadline deadline) override {
    co_return co_await call(EnvCall::kStep, env_request_json(task, state, turns), deadline);
  }

 private:
  Awaitable<Result<EnvTurn>> call(EnvCall which, Json payload, Deadline deadline) {
    const std::string url = fmt::format("{}/{}", options_.url, to_string(which));
    const std::string where = fmt::format("environment server {}", url);
    const auto left = deadline - SteadyClock::now();
    if (left <= Duration::zero())
      co_return make_error(ErrorCode::kTimeout, fmt::format("{}: the deadline passed before the call", where));
    auto client = co_await bind_client();
    if (!client) co_return std::unexpected(std::move(client).error());
    http::ClientRequest req;
    req.method = http::Verb::post;
    req.url = url;
    req.body = payload.dump(-1, ' ', false, Json::error_handler_t::replace);
    req.timeout = std::chrono::duration_cast<http::Duration>(left);
    req.idempotent = false;
    auto response = co_await (*client)->request(std::move(req));
    if (!response) co_return std::unexpected(std::move(response).error().with_context(where));
    if (response->status < 200 || response->status >= 300)
      co_return make_error(ErrorCode::kUnavailable,
                           fmt::format("{} answered HTTP {}: {}", where, response->status, excerpt(response->body)));
    auto turn = parse_env_reply(response->body, which);
    if (!turn) co_return std::unexpected(std::move(turn).error().with_context(where));
    co_return turn;
  }

  // The client of the io_context this call runs on (made at the first call).
  Awaitable<Result<http::Client*>> bind_client() {
    if (client_) co_return client_.get();
    auto ex = co_await asio::this_coro::executor;
    const auto* io_ex = ex.target<asio::io_context::executor_type>();
    if (!io_ex) co_return make_error(ErrorCode::kInternal, "http environment: not called on an io_context");
    http::ClientOptions copts;
    copts.retry.max_attempts = 1;
    client_ = std::make_unique<http::Client>(io_ex->context(), copts);
    co_return client_.get();
  }

  HttpEnvironmentOptions options_;
  std::unique_ptr<http::Client> client_;
};

}  // namespace

Awaitable<Result<EnvTurn>> LocalEnvironment::reset(const Task& task, Deadline /*deadline*/) {
  co_return reset_now(task);
}

Awaitable<Result<EnvTurn>> LocalEnvironment::step(const Task& task, const Json& state,
                                                  const std::vector<ChatMessage>& turns, Deadline /*deadline*/) {
  co_return step_now(task, state, turns);
}

Result<std::string> last_model_turn(std::string_view who, const std::vector<ChatMessage>& turns) {
  if (turns.empty() || turns.back().role != "assistant")
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("{}: step needs the model's turn last (role assistant)", who));
  const std::string& text = turns.back().content;
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return std::string();
  return text.substr(first, text.find_last_not_of(" \t\r\n") - first + 1);
}

Result<std::int64_t> state_counter(std::string_view who, const Json& state, const std::string& key) {
  if (!state.is_object() || !state.contains(key) || !state[key].is_number_integer() ||
      state[key].get<std::int64_t>() < 0)
    return make_error(ErrorCode::kInvalidArgument, fmt::format("{}: state must be {{\"{}\": <n >= 0>}}", who, key));
  return state[key].get<std::int64_t>();
}

std::string_view to_string(EnvCall call) { return call == EnvCall::kReset ? "reset" : "step"; }

Json env_request_json(const Task& task) { return {{"task", to_json(task)}}; }

Json env_request_json(const Task& task, const Json& state, const std::vector<ChatMessage>& turns) {
  return {{"task", to_json(task)}, {"state", state}, {"turns", to_json(turns)}};
}

Result<EnvTurn> parse_env_reply(std::string_view body, EnvCall call) {
  if (const std::size_t bad = utf8_prefix(body); bad < body.size())
    return parse_error(call, fmt::format("the body is not valid UTF-8 (byte {} of {})", bad, body.size()));
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return parse_error(call, fmt::format("not JSON: '{}'", excerpt(body)));
  if (!j.is_object()) return parse_error(call, "expected a JSON object");
  EnvTurn turn;
  ARLO_ASSIGN_OR_RETURN(turn.messages, parse_messages(j, call));
  ARLO_TRY(parse_done_and_reward(j, call, turn));
  if (j.contains("state")) turn.state = std::move(j["state"]);
  if (j.contains("tools") && !j["tools"].is_null()) {
    if (call == EnvCall::kStep) return parse_error(call, "'tools' is only for reset");
    if (auto names = tool_names(j["tools"]); !names) return parse_error(call, names.error().message());
    turn.tools = std::move(j["tools"]);
  }
  return turn;
}

Result<std::shared_ptr<MultiTurnEnvironment>> make_http_environment(HttpEnvironmentOptions options) {
  if (options.url.rfind("http://", 0) != 0)
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("environment 'http': url (env.url) must start with http://, got '{}'", options.url));
  return std::shared_ptr<MultiTurnEnvironment>(std::make_shared<HttpEnvironment>(std::move(options)));
}

}  // namespace arlo::rollout
