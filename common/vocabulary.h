#pragma once
// The shared vocabulary: value types every module speaks (orchestrator, rollout, the reference
// engine, weight_sync, the trainer bridge), defined once here so that no adapter converts between
// look-alike copies (docs/architecture.md section 7). Plain data with no behaviour beyond parsing
// and printing its names; nothing here does I/O.
//
// Modules live inside namespace arlo, so they use these names unqualified (VersionSpan, Task) and
// need no using-declarations; code outside it writes arlo::Task. No module redefines them.
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <expected>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace arlo {

// Policy version = number of optimizer steps applied. kNoVersion: none yet (a worker that has not
// loaded weights, a trainer that has published nothing).
using Version = std::int64_t;
inline constexpr Version kNoVersion = -1;

// Generated tokens [first_token, next span's first_token) of a completion came from policy
// `version`. A completion's spans are sorted by first_token; the first starts at 0.
struct VersionSpan {
  Version version = 0;
  std::int64_t first_token = 0;
  bool operator==(const VersionSpan&) const = default;
};

// How an inference server pauses for a weight update:
//   keep  - stop at the next token boundary; in-flight requests keep their state and continue on the
//           new weights after resume (their version spans record the switch);
//   wait  - admit nothing new; in-flight requests run to completion; then paused;
//   abort - in-flight requests finish now with finish reason "abort" (the tokens so far are kept).
enum class PauseMode { kKeep, kWait, kAbort };
std::string_view to_string(PauseMode mode);                        // "keep" | "wait" | "abort"
std::optional<PauseMode> parse_pause_mode(std::string_view text);  // nullopt for anything else

// Why a sample stopped. kError / kUnknown: a server reported an error or a reason arlo does not know.
enum class FinishReason { kStop, kLength, kAbort, kError, kUnknown };
std::string_view to_string(FinishReason reason);  // "stop" | "length" | "abort" | "error" | "unknown"
// "stop" | "eos" | "stop_sequence" | "end_turn" -> kStop, "length" | "max_tokens" -> kLength,
// "abort" | "cancelled" | "canceled" -> kAbort, "error" -> kError, anything else -> kUnknown.
FinishReason parse_finish_reason(std::string_view text);

// One chat message: of a task's prompt, a trajectory's turns, a gateway call. The OpenAI format's
// tool fields: an assistant message's `tool_calls` ([{"id", "type": "function", "function": {"name",
// "arguments": a JSON string}}], null when it calls none) and a tool result's `tool_call_id` (role
// "tool"); `name` is the optional participant or tool name.
struct ChatMessage {
  std::string role;  // "system" | "user" | "assistant" | "tool" | ...
  std::string content;
  nlohmann::json tool_calls{};  // null, or the OpenAI array above
  std::string tool_call_id{};
  std::string name{};
  bool operator==(const ChatMessage&) const = default;
};

// The message in the OpenAI format: {"role", "content"} plus the tool fields that are set.
nlohmann::json to_json(const ChatMessage& message);
std::vector<nlohmann::json> to_json(const std::vector<ChatMessage>& messages);
// A message from the OpenAI format: "role" a string; "content" a string, null, absent or an array of
// {"type": "text", "text"} parts (joined); "tool_calls" null or an array of objects each with a
// "function" object holding a string "name" and "arguments" (a string, or an object that is dumped);
// "tool_call_id" and "name" strings. The error names the field ("content must be ...").
std::expected<ChatMessage, std::string> chat_message_from_json(const nlohmann::json& j);

// One task from an environment, from the environment through the orchestrator to the reward
// modules. Exactly one of `prompt` / `messages` is set. `prompt_tokens` may be empty when the
// inference server tokenizes the prompt; `answer_tokens` is needed only for the supervised warm-up
// (ce_weights). Reward modules and plugins see it as JSON without the token ids (rollout::to_json).
struct Task {
  std::string id;                     // unique within its environment
  std::string env;                    // environment name ("arithmetic", "gsm8k", ...)
  std::optional<std::string> prompt;  // completions-style prompt
  std::vector<ChatMessage> messages;  // chat-style prompt (used when `prompt` is empty)
  nlohmann::json tools{};             // OpenAI-format tool schemas the model may call (null: none); chat tasks
  std::string answer;                 // reference answer for reward modules ("" when none)
  nlohmann::json info = nlohmann::json::object();  // free-form, passed to reward modules untouched
  std::vector<std::int32_t> prompt_tokens{};       // the prompt as token ids (empty: not tokenized)
  std::vector<std::int32_t> answer_tokens{};       // the answer as token ids (empty: not tokenized)

  bool is_chat() const { return !prompt.has_value(); }
  // The prompt as one string: `prompt`, or the messages joined as "role: content" lines.
  std::string prompt_text() const;
  bool operator==(const Task&) const = default;
};

// The sampling parameters of one generation request: one struct from the configuration's sampling
// section through the orchestrator and the OpenAI client to the reference engine. Servers that do
// not know a field ignore it (only arlo-worker reads ignore_eos).
struct SamplingParams {
  double temperature = 1.0;             // >= 0; 0 = greedy
  double top_p = 1.0;                   // in (0, 1]
  std::int64_t max_tokens = 64;         // >= 1; generation also stops at the model's context
  std::optional<std::uint64_t> seed{};  // the request's random stream; absent: the server picks one
  std::vector<std::string> stop{};      // generation stops when the text contains one (text cut before it)
  int n = 1;                            // samples per request
  bool logprobs = true;                 // report each generated token's logprob
  int top_logprobs = 0;                 // also the k most likely tokens at each step (0..20)
  bool ignore_eos = false;              // keep generating past the end-of-sequence token
};

// Deadlines are time points on the monotonic clock everywhere (never a Duration named `deadline`).
using SteadyClock = std::chrono::steady_clock;
using Deadline = SteadyClock::time_point;

}  // namespace arlo
