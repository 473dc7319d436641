#pragma once
// Tool calls in model text (docs/environments.md, "Tool calls"): the one documented syntax, the
// Hermes/Qwen form that Qwen's chat templates render and vLLM's `hermes` tool parser reads:
//
//   <tool_call>{"name": "calc", "arguments": {"expr": "2+3"}}</tool_call>
//
// Each block is one call; text outside the blocks is the message's content. The calls come out in
// the OpenAI form: [{"id": "call_<k>", "type": "function", "function": {"name", "arguments": a JSON
// string}}], k counting from 0 in the text's order.
#include <string>
#include <string_view>

#include "common/result.h"
#include "rollout/types.h"

namespace arlo::rollout {

inline constexpr std::string_view kToolCallOpen = "<tool_call>";
inline constexpr std::string_view kToolCallClose = "</tool_call>";

struct ParsedToolCalls {
  std::string content;  // the text without the blocks, surrounding whitespace trimmed
  Json tool_calls;      // null when the text has no block, else the OpenAI array
};

// Parses `text`. `tools` is the trajectory's OpenAI tool schemas (null or empty: any name goes).
// kInvalidArgument naming what is wrong with a malformed block: "tool call 1: arguments must be a
// JSON object", an unclosed tag, a body that is not JSON, no "name", a name not among `tools`.
Result<ParsedToolCalls> parse_tool_calls(std::string_view text, const Json& tools);

// The names a tools array declares ([{"type": "function", "function": {"name"}}]); kInvalidArgument
// naming the entry that has no such name (for checking a request's or an environment's "tools").
Result<std::vector<std::string>> tool_names(const Json& tools);

// A chat message of the model's with its tool calls filled in from its text: `message` unchanged
// when it already has tool_calls or is not the assistant's; otherwise content and tool_calls from
// parse_tool_calls (the error as there).
Result<ChatMessage> with_parsed_tool_calls(ChatMessage message, const Json& tools);

// The OpenAI tool_calls array rendered back in the documented syntax (one block per call, newline
// separated), for chat templates that have no tool support of their own.
std::string render_tool_calls(const Json& tool_calls);

}  // namespace arlo::rollout
