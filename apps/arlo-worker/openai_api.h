#pragma once
// OpenAI-compatible request parsing and response building for arlo-worker.
// Pure JSON in and out: no HTTP, no libtorch, so it is cheap to compile and easy to test.
//
// Completions (POST /v1/completions):
//   prompt: a string, a list of token ids, or a list of either (several prompts); text prompts get
//   <bos> prepended, token-id prompts are used as given. max_tokens (default 16), temperature (1),
//   top_p (1), n (1), seed, stop (string or list), logprobs (null or 0..5: 0 = the chosen token's
//   logprob only), ignore_eos; echo, stream, best_of > n, suffix are refused with 400.
// Chat (POST /v1/chat/completions): messages [{role: system|user|assistant|tool, content: string or
//   [{type: "text", text}]}] through the tokenizer's chat template (a "tool" message is rendered as
//   a user turn: the template has no tool role); max_tokens or
//   max_completion_tokens (default: what fits in the context); logprobs (bool), top_logprobs (0..20).
//   Tool calls (docs/environments.md, "Tool calls"): "tools" (OpenAI function schemas; checked, not
//   rendered: the template has no tool section) and "tool_choice" ("none" turns parsing off); an
//   assistant message's "tool_calls" are rendered after its content as <tool_call>{"name",
//   "arguments"}</tool_call> blocks. With tools, a choice whose text holds well-formed blocks answers
//   message.tool_calls (ids "call_<k>"), the content without them, finish_reason "tool_calls"; a
//   malformed block stays in the content as text.
// Responses follow the OpenAI reference (id, object, created, model, choices, usage) and add, per
// choice, token_ids, prompt_token_ids, version_spans ([[version, first_token], ...]) and
// stop_reason (the matched stop string or null), as vLLM does with return_token_ids.
// Seeds: choice k (counting across prompts) of a request with seed s samples with seed s + k.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <expected>
#include <optional>
#include <string>
#include <vector>

#include "reference/engine.h"
#include "reference/tokenizer.h"

namespace arlo::worker {

struct ApiError {
  int status = 400;
  std::string message;
  std::optional<std::string> param;
  std::string type = "invalid_request_error";
};

struct CompletionJob {
  bool chat = false;
  std::vector<std::vector<std::int32_t>> prompts;
  arlo::SamplingParams params;  // seed, if any, is the request's; see choice_params()
  int n = 1;
  bool logprobs = false;           // report per-token logprobs
  int top_logprobs = 0;            // alternatives per token
  nlohmann::json tools = nullptr;  // chat: the request's "tools" (null: none, or tool_choice "none")

  // The sampling parameters of choice `k` (prompt-major: prompt p, sample i -> k = p * n + i).
  arlo::SamplingParams choice_params(int k) const;
  int choices() const { return static_cast<int>(prompts.size()) * n; }
};

std::expected<CompletionJob, ApiError> parse_completion_request(const nlohmann::json& body, bool chat,
                                                                const reference::Tokenizer& tokenizer, int context);

// `generations` holds choices() entries, prompt-major.
nlohmann::json completion_response(const CompletionJob& job, const std::vector<reference::Generation>& generations,
                                   const std::string& model, const reference::Tokenizer& tokenizer,
                                   const std::string& id, std::int64_t created);

// POST /tokenize, with vLLM's fields: {"messages", "add_generation_prompt" (default true)} renders
// the conversation through the chat template (without the closing <|assistant|> when false);
// {"prompt", "add_special_tokens" (default true: <bos> first)} encodes the text. Answers
// {"count", "max_model_len", "tokens"}.
std::expected<nlohmann::json, ApiError> tokenize_request(const nlohmann::json& body,
                                                         const reference::Tokenizer& tokenizer, int context);

// {"error": {"message", "type", "param", "code"}}
nlohmann::json error_body(const ApiError& e);

}  // namespace arlo::worker
