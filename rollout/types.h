#pragma once
// Plain data that flows through the rollout module: tasks from environments, requests to and
// completions from inference workers, and finished rollouts with their scores (docs/architecture.md section 2).
//
// All types are values: copyable, no hidden sharing, safe to move across threads.
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "common/sample.h"
#include "common/vocabulary.h"

namespace arlo::rollout {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using Duration = Clock::duration;

// Tasks, chat messages, finish reasons, sampling parameters, versions and version spans are the shared
// vocabulary's (common/vocabulary.h, namespace arlo).

// One request to an inference worker (an OpenAI-compatible server). Prompt precedence: prompt_token_ids, then messages
// (chat endpoint), then prompt.
struct CompletionRequest {
  std::string model;  // "" lets the server pick its only model
  std::optional<std::string> prompt;
  std::vector<std::int32_t> prompt_token_ids;
  std::vector<ChatMessage> messages;  // non-empty => /v1/chat/completions
  Json tools = nullptr;               // chat only: OpenAI tool schemas, sent as "tools" (null/empty: none)
  Json tool_choice = nullptr;         // chat only: "tool_choice" when tools are sent (null: the server's default)
  SamplingParams sampling;
  std::string affinity_key;     // requests with the same key go to the same worker
  Json extra = Json::object();  // merged into the request body (server-specific knobs)
  // The pool adds "cache_salt": the salt of the weights the chosen worker serves when the request
  // leaves (InferencePool::cache_salt), so that vLLM and SGLang reuse no prefix KV computed under
  // other weights.
  bool cache_salt = false;

  bool is_chat() const { return !messages.empty() && prompt_token_ids.empty(); }
};

struct CompletionChoice {
  int index = 0;
  std::string text;
  std::vector<std::int32_t> token_ids;
  std::vector<float> logprobs;  // one per generated token when requested
  FinishReason finish_reason = FinishReason::kUnknown;
  std::vector<VersionSpan> version_spans;  // empty when the server does not report versions
  Json tool_calls = nullptr;               // chat: the message's OpenAI tool_calls (null: none)
};

struct Completion {
  std::string id;
  std::string model;
  std::vector<std::int32_t> prompt_token_ids;
  std::vector<CompletionChoice> choices;  // sorted by index
  std::string worker;                     // base URL of the worker that produced it
  int attempts = 1;                       // workers tried (1 = first try succeeded)
};

// One generated sample of a prompt group, as reward modules see it: the shared Sample
// (common/sample.h), the one value that travels from the inference adapter to the trainer batch.
// Modules read task_id, sample_index, completion_tokens, text, logprobs, version_spans and
// finish_reason; the scorer sets reward (unset until scored, and when the `drop` policy leaves it
// unscored) and metrics.
using Rollout = Sample;

// JSON forms, used by the http reward module, checkpoints and logs. A task's JSON is what reward
// plugins and HTTP reward servers receive: id, env, answer, info and prompt or messages, never its
// token ids (the orchestrator's checkpoint form, orch::task_checkpoint_json, keeps those).
Json to_json(const Task& task);
Result<Task> task_from_json(const Json& j);
Json to_json(const Rollout& rollout);
Json to_json(const std::vector<VersionSpan>& spans);

}  // namespace arlo::rollout
