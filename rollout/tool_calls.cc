#include "rollout/tool_calls.h"

#include <algorithm>

#include <fmt/format.h>

namespace arlo::rollout {
namespace {

std::string trimmed(std::string_view s) {
  const auto first = s.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return {};
  return std::string(s.substr(first, s.find_last_not_of(" \t\r\n") - first + 1));
}

std::unexpected<Error> malformed(std::size_t k, const std::string& what) {
  return make_error(ErrorCode::kInvalidArgument, fmt::format("tool call {}: {}", k, what));
}

// One block's body -> the OpenAI call "call_<k>".
Result<Json> parse_block(std::string_view body, std::size_t k, const std::vector<std::string>& names) {
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return malformed(k, fmt::format("not JSON: '{}'", trimmed(body.substr(0, 80))));
  if (!j.is_object()) return malformed(k, "must be a JSON object {\"name\", \"arguments\"}");
  if (!j.contains("name") || !j["name"].is_string() || j["name"].get<std::string>().empty())
    return malformed(k, "\"name\" (a non-empty string) is missing");
  const std::string name = j["name"].get<std::string>();
  if (!names.empty() && std::find(names.begin(), names.end(), name) == names.end())
    return malformed(k, fmt::format("unknown tool '{}'", name));
  Json arguments = Json::object();
  if (j.contains("arguments") && !j["arguments"].is_null()) {
    if (!j["arguments"].is_object()) return malformed(k, "\"arguments\" must be a JSON object");
    arguments = j["arguments"];
  }
  return Json{{"id", fmt::format("call_{}", k)},
              {"type", "function"},
              {"function", {{"name", name}, {"arguments", arguments.dump()}}}};
}

}  // namespace

Result<std::vector<std::string>> tool_names(const Json& tools) {
  std::vector<std::string> names;
  if (tools.is_null()) return names;
  if (!tools.is_array()) return make_error(ErrorCode::kInvalidArgument, "tools must be an array");
  for (std::size_t i = 0; i < tools.size(); ++i) {
    const Json& t = tools[i];
    const Json* fn = t.is_object() && t.contains("function") ? &t["function"] : nullptr;
    if (!fn || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string())
      return make_error(
          ErrorCode::kInvalidArgument,
          fmt::format("tools[{}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}", i));
    names.push_back((*fn)["name"].get<std::string>());
  }
  return names;
}

Result<ParsedToolCalls> parse_tool_calls(std::string_view text, const Json& tools) {
  ARLO_ASSIGN_OR_RETURN(const auto names, tool_names(tools));
  ParsedToolCalls out;
  std::string content;
  Json calls = Json::array();
  std::size_t pos = 0;
  while (true) {
    const auto open = text.find(kToolCallOpen, pos);
    if (open == std::string_view::npos) {
      content += text.substr(pos);
      break;
    }
    content += text.substr(pos, open - pos);
    const auto body_start = open + kToolCallOpen.size();
    const auto close = text.find(kToolCallClose, body_start);
    if (close == std::string_view::npos) return malformed(calls.size(), "<tool_call> is not closed by </tool_call>");
    const std::string_view body = text.substr(body_start, close - body_start);
    if (body.find(kToolCallOpen) != std::string_view::npos)
      return malformed(calls.size(), "<tool_call> is not closed by </tool_call>");
    ARLO_ASSIGN_OR_RETURN(Json call, parse_block(body, calls.size(), names));
    calls.push_back(std::move(call));
    pos = close + kToolCallClose.size();
  }
  if (content.find(kToolCallClose) != std::string::npos)
    return malformed(calls.size(), "</tool_call> without <tool_call>");
  out.content = trimmed(content);
  if (!calls.empty()) out.tool_calls = std::move(calls);
  return out;
}

Result<ChatMessage> with_parsed_tool_calls(ChatMessage message, const Json& tools) {
  if (message.role != "assistant" || !message.tool_calls.is_null()) return message;
  ARLO_ASSIGN_OR_RETURN(auto parsed, parse_tool_calls(message.content, tools));
  if (parsed.tool_calls.is_null()) return message;
  message.content = std::move(parsed.content);
  message.tool_calls = std::move(parsed.tool_calls);
  return message;
}

std::string render_tool_calls(const Json& tool_calls) {
  std::string out;
  if (!tool_calls.is_array()) return out;
  for (const Json& call : tool_calls) {
    if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) continue;
    const Json& fn = call["function"];
    Json arguments = Json::object();
    if (fn.contains("arguments") && fn["arguments"].is_string()) {
      Json parsed = Json::parse(fn["arguments"].get<std::string>(), nullptr, false);
      if (!parsed.is_discarded()) arguments = std::move(parsed);
    } else if (fn.contains("arguments") && fn["arguments"].is_object()) {
      arguments = fn["arguments"];
    }
    Json block = {{"name", fn.value("name", "")}, {"arguments", arguments}};
    if (!out.empty()) out += '\n';
    out += fmt::format("{}{}{}", kToolCallOpen, block.dump(), kToolCallClose);
  }
  return out;
}

}  // namespace arlo::rollout
