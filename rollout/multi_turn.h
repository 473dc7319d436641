#pragma once
// Multi-turn environments: the model answers, the environment replies (feedback, a tool's result),
// the model goes on, until the environment says done (docs/environments.md).
//
//   reset(task)                 -> the first messages (empty: the task's prompt stands) and a state
//   step(task, state, turns)    -> the messages it adds, done, an optional reward, the next state
//
// The state is the environment's own JSON, kept by the caller per trajectory and handed back on the
// next step, so an environment object holds no per-trajectory data and serves every trajectory at
// once. `turns` is the trajectory's conversation so far, its last entry the model's latest turn
// ({"assistant", text}). Messages are text: tokenizing them is the caller's job (token-in/token-out).
// For a completion-style task (Task::prompt) each message's content is appended to the text as is.
//
// An environment is a MultiTurnEnvironment: built-in ones answer at once (LocalEnvironment), the
// `http` kind's client speaks the protocol below to a server in any language.
//
// HTTP protocol (JSON over POST; <url> is env.url):
//   POST <url>/reset {"task": {...}}                                 -> {"messages": [...], "state": ...}
//   POST <url>/step  {"task": {...}, "state": ..., "turns": [...]}   -> {"messages": [...], "done": bool,
//                                                                         "reward": number|null, "state": ...}
// reset's reply may also give "tools" (an array of OpenAI tool schemas, {"type": "function",
// "function": {"name", "description", "parameters"}}): the trajectory's model may call them.
// Tool calls (docs/environments.md, "Tool calls"): the model's turn in `turns` carries its calls as
// OpenAI "tool_calls" (parsed from its <tool_call> blocks, rollout/tool_calls.h), and the
// environment answers each with a {"role": "tool", "content", "tool_call_id"} message.
// A message is {"role": string, "content": string} plus those tool fields. The task is rollout::to_json(task). A call
// that misses its deadline (kTimeout), a non-2xx answer (kUnavailable), a body that is not JSON or has a field of the
// wrong type or text that is not UTF-8 (kParse, naming the field) is an Error, never a crash.
//
// Threading: an environment is shared by every trajectory of a run; its calls run on the caller's
// io_context thread. The http client binds to the io_context of its first call.
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/async/coro.h"
#include "common/result.h"
#include "rollout/types.h"

namespace arlo::rollout {

// What the environment says at reset or after a model turn.
struct EnvTurn {
  std::vector<ChatMessage> messages;  // appended to the trajectory (reset: replace the task's prompt)
  bool done = false;                  // the trajectory ends (always false from reset)
  std::optional<double> reward{};     // the trajectory's reward, when the environment gives one
  Json state = nullptr;               // handed back to the next step
  Json tools = nullptr;               // reset only: the OpenAI tool schemas the model may call (null: none)
};

// The arguments of reset and step are references: co_await the call before they go away.
class MultiTurnEnvironment {
 public:
  virtual ~MultiTurnEnvironment() = default;
  virtual Awaitable<Result<EnvTurn>> reset(const Task& task, Deadline deadline) = 0;
  virtual Awaitable<Result<EnvTurn>> step(const Task& task, const Json& state, const std::vector<ChatMessage>& turns,
                                          Deadline deadline) = 0;
};

// An environment that answers at once, without I/O (the built-in ones): reset and step call
// reset_now and step_now, so the deadline never matters. Tests call the *_now functions directly.
class LocalEnvironment : public MultiTurnEnvironment {
 public:
  virtual Result<EnvTurn> reset_now(const Task& task) const = 0;
  virtual Result<EnvTurn> step_now(const Task& task, const Json& state,
                                   const std::vector<ChatMessage>& turns) const = 0;

  Awaitable<Result<EnvTurn>> reset(const Task& task, Deadline deadline) override;
  Awaitable<Result<EnvTurn>> step(const Task& task, const Json& state, const std::vector<ChatMessage>& turns,
                                  Deadline deadline) override;
};

// For built-in environments: the text of the model's latest turn without surrounding whitespace, the
// content of the last entry of `turns`, which must be the assistant's (kInvalidArgument naming `who`
// otherwise).
Result<std::string> last_model_turn(std::string_view who, const std::vector<ChatMessage>& turns);
// For built-in environments whose state is one counter, {"<key>": n}: n, or kInvalidArgument naming
// `who` when the state is not that object with an integer n >= 0.
Result<std::int64_t> state_counter(std::string_view who, const Json& state, const std::string& key);

// The protocol's messages, for the client, the tests and the fuzz target.
enum class EnvCall { kReset, kStep };
std::string_view to_string(EnvCall call);                                                           // "reset" | "step"
Json env_request_json(const Task& task);                                                            // reset's body
Json env_request_json(const Task& task, const Json& state, const std::vector<ChatMessage>& turns);  // step's
// Parses a reply body: kParse naming the field that is missing or of the wrong type, or the byte
// where the body stops being UTF-8. reset's reply needs no "done" (false when given) and may not
// give a reward; step's needs "done". Absent "messages" means none, absent "state" null.
Result<EnvTurn> parse_env_reply(std::string_view body, EnvCall call);

struct HttpEnvironmentOptions {
  std::string url;  // http://host:port[/prefix]; the routes are <url>/reset and <url>/step
};
// The protocol's client. kInvalidArgument for a url that is not http://...
Result<std::shared_ptr<MultiTurnEnvironment>> make_http_environment(HttpEnvironmentOptions options);

}  // namespace arlo::rollout
