#include "session/adapters/environment_adapter.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/async/coro.h"
#include "common/log.h"
#include "rollout/tool_calls.h"

namespace arlo::session::adapters {

namespace {

using nlohmann::json;

// The "tokens" of a /tokenize answer: a list of integers.
Result<std::vector<std::int32_t>> parse_tokens(const std::string& worker, const http::Response& response) {
  if (response.status >= 500)
    return make_error(ErrorCode::kUnavailable, fmt::format("{}/tokenize answered {}: {}", worker, response.status,
                                                           response.body.substr(0, 200)));
  if (response.status != 200)
    return make_error(ErrorCode::kInvalidArgument, fmt::format("{}/tokenize answered {}: {}", worker, response.status,
                                                               response.body.substr(0, 200)));
  auto body = response.parse_json();
  if (!body) return std::unexpected(body.error());
  if (!body->is_object() || !body->contains("tokens") || !(*body)["tokens"].is_array())
    return make_error(ErrorCode::kParse, fmt::format("{}/tokenize: the answer has no \"tokens\" list", worker));
  std::vector<std::int32_t> ids;
  for (const auto& t : (*body)["tokens"]) {
    if (!t.is_number_integer())
      return make_error(ErrorCode::kParse, fmt::format("{}/tokenize: \"tokens\" holds a non-integer", worker));
    ids.push_back(t.get<std::int32_t>());
  }
  return ids;
}

}  // namespace

std::optional<std::vector<std::int32_t>> extension_of(const std::vector<std::int32_t>& ids,
                                                      const std::vector<std::int32_t>& prefix,
                                                      const std::vector<std::int32_t>& more) {
  if (ids.size() < prefix.size() + more.size()) return std::nullopt;
  if (!std::equal(prefix.begin(), prefix.end(), ids.begin())) return std::nullopt;
  const auto after_prefix = ids.begin() + static_cast<std::ptrdiff_t>(prefix.size());
  if (!std::equal(more.begin(), more.end(), after_prefix)) return std::nullopt;
  return std::vector<std::int32_t>(after_prefix + static_cast<std::ptrdiff_t>(more.size()), ids.end());
}

// --- WorkerTokenizer ---

Awaitable<Result<std::vector<std::int32_t>>> WorkerTokenizer::text(std::string worker, std::string text,
                                                                   orch::TimePoint deadline) {
  json body = {{"prompt", std::move(text)}, {"add_special_tokens", false}};
  auto op = call(std::move(worker), std::move(body), deadline);
  co_return co_await std::move(op);
}

Awaitable<Result<std::vector<std::int32_t>>> WorkerTokenizer::chat(std::string worker,
                                                                   std::vector<ChatMessage> messages,
                                                                   orch::TimePoint deadline, json tools) {
  json body = {{"messages", to_json(messages)}, {"add_generation_prompt", true}};
  if (tools.is_array() && !tools.empty()) body["tools"] = std::move(tools);  // rendered as the model saw them
  auto op = call(std::move(worker), std::move(body), deadline);
  co_return co_await std::move(op);
}

Awaitable<Result<std::vector<std::int32_t>>> WorkerTokenizer::call(std::string worker, json body,
                                                                   orch::TimePoint deadline) {
  using R = Result<std::vector<std::int32_t>>;
  if (!network_) {
    auto op = call_here(std::move(worker), std::move(body), deadline);
    co_return co_await std::move(op);
  }
  auto op = run_on<R>(*network_, [this, worker = std::move(worker), body = std::move(body), deadline]() mutable {
    return call_here(std::move(worker), std::move(body), deadline);
  });
  co_return co_await std::move(op);
}

Awaitable<Result<std::vector<std::int32_t>>> WorkerTokenizer::call_here(std::string worker, json body,
                                                                        orch::TimePoint deadline) {
  if (worker.empty())
    co_return make_error(ErrorCode::kInvalidArgument, "tokenize: the trajectory names no worker that served it");
  const auto left = deadline - orch::Clock_::now();
  if (left <= orch::Duration::zero())
    co_return make_error(ErrorCode::kTimeout, fmt::format("{}/tokenize: the deadline passed", worker));
  http::ClientRequest request;
  request.method = http::Verb::post;
  request.url = worker + "/tokenize";
  request.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  request.timeout = left;
  request.idempotent = true;  // tokenizing changes nothing: a retry is safe
  auto response = co_await client_.request(std::move(request));
  if (!response) co_return std::unexpected(Error(response.error()).with_context(worker + "/tokenize"));
  co_return parse_tokens(worker, *response);
}

// --- EnvironmentAdapter ---

EnvironmentAdapter::EnvironmentAdapter(
    std::map<std::string, std::shared_ptr<rollout::MultiTurnEnvironment>> environments, WorkerTokenizer& tokenizer)
    : environments_(std::move(environments)), tokenizer_(tokenizer) {}

rollout::MultiTurnEnvironment* EnvironmentAdapter::find(const Task& task) const {
  auto it = environments_.find(task.env);
  if (it == environments_.end()) it = environments_.find("");
  return it == environments_.end() ? nullptr : it->second.get();
}

bool EnvironmentAdapter::multi_turn(const Task& task) const { return find(task) != nullptr; }

Result<rollout::MultiTurnEnvironment*> EnvironmentAdapter::environment(const Task& task) const {
  if (auto* env = find(task)) return env;
  return make_error(ErrorCode::kNotFound, fmt::format("task {}: no multi-turn environment '{}'", task.id, task.env));
}

Awaitable<Result<orch::EnvReply>> EnvironmentAdapter::reset(std::shared_ptr<const Task> task,
                                                            orch::TimePoint deadline) {
  auto env = environment(*task);
  if (!env) co_return std::unexpected(env.error());
  ++stats_.resets;
  auto op = (*env)->reset(*task, deadline);
  auto turn = co_await std::move(op);
  if (!turn) co_return std::unexpected(turn.error());
  orch::EnvReply reply;
  reply.messages = std::move(turn->messages);
  reply.state = std::move(turn->state);
  reply.tools = std::move(turn->tools);
  co_return reply;
}

Awaitable<Result<orch::EnvReply>> EnvironmentAdapter::step(std::shared_ptr<const Task> task, const Sample& trajectory,
                                                           std::vector<std::int32_t> prompt_tokens,
                                                           orch::TimePoint deadline) {
  auto env = environment(*task);
  if (!env) co_return std::unexpected(env.error());
  ++stats_.steps;
  // The model's tool calls go to the environment as OpenAI tool_calls (rollout/tool_calls.h); a
  // malformed one ends the trajectory with env reward 0 (the model is penalized, not dropped).
  std::vector<ChatMessage> turns = trajectory.turns;
  if (!turns.empty()) {
    auto parsed = rollout::with_parsed_tool_calls(turns.back(), task->tools);
    if (!parsed) {
      ARLO_WARN_EVERY(5.0, "environment: task {}: malformed tool call, the trajectory ends: {}", task->id,
                      parsed.error().message());
      orch::EnvReply ended;
      ended.done = true;
      ended.reward = 0.0;
      ended.ended_because = "malformed_tool_call";
      co_return ended;
    }
    turns.back() = std::move(*parsed);
  }
  auto op = (*env)->step(*task, trajectory.env_state, turns, deadline);
  auto turn = co_await std::move(op);
  if (!turn) co_return std::unexpected(turn.error());
  orch::EnvReply reply;
  reply.done = turn->done;
  reply.reward = turn->reward;
  reply.state = turn->state;
  if (!reply.done) {
    auto tokens_op = tokens_of(*task, trajectory, prompt_tokens, *turn, deadline);
    auto tokens = co_await std::move(tokens_op);
    if (!tokens) co_return std::unexpected(tokens.error());
    if (!tokens->extends) {  // the template does not extend the trajectory: it splits here
      ++stats_.splits;
      ARLO_WARN_EVERY(5.0,
                      "environment: task {}: the chat template of {} does not extend the trajectory's ids; "
                      "the trajectory splits after its model turn {}",
                      task->id, trajectory.worker, trajectory.turn_versions.size());
      if (on_split_) on_split_();
      if (tokens->ids.empty())
        co_return make_error(ErrorCode::kParse,
                             fmt::format("{}/tokenize rendered the conversation as no ids", trajectory.worker));
      reply.restart_prompt = std::move(tokens->ids);
    } else {
      reply.tokens = std::move(tokens->ids);
    }
  }
  reply.messages = std::move(turn->messages);
  co_return reply;
}

Awaitable<Result<EnvironmentAdapter::TurnIds>> EnvironmentAdapter::tokens_of(const Task& task, const Sample& trajectory,
                                                                             const std::vector<std::int32_t>& prompt,
                                                                             const rollout::EnvTurn& turn,
                                                                             orch::TimePoint deadline) {
  if (!task.is_chat()) {
    std::string text;
    for (const auto& m : turn.messages) text += m.content;
    if (text.empty()) co_return TurnIds{};
    auto op = tokenizer_.text(trajectory.worker, std::move(text), deadline);
    auto ids = co_await std::move(op);
    if (!ids) co_return std::unexpected(ids.error());
    co_return TurnIds{std::move(*ids), true};
  }
  std::vector<ChatMessage> conversation = task.messages;
  conversation.insert(conversation.end(), trajectory.turns.begin(), trajectory.turns.end());
  conversation.insert(conversation.end(), turn.messages.begin(), turn.messages.end());
  auto op = tokenizer_.chat(trajectory.worker, std::move(conversation), deadline, task.tools);
  auto rendered = co_await std::move(op);
  if (!rendered) co_return std::unexpected(rendered.error());
  if (auto more = extension_of(*rendered, prompt, trajectory.completion_tokens))
    co_return TurnIds{std::move(*more), true};
  co_return TurnIds{std::move(*rendered), false};
}

}  // namespace arlo::session::adapters
