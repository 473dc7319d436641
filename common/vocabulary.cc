#include "common/vocabulary.h"

#include "common/enum_names.h"

namespace arlo {

namespace {

constexpr EnumName<PauseMode> kPauseModes[] = {
    {PauseMode::kKeep, "keep"}, {PauseMode::kWait, "wait"}, {PauseMode::kAbort, "abort"}};

// Each reason's name first; then the other servers' words for it (OpenAI, TGI, Anthropic-style).
// kUnknown has no row: it prints as "unknown" and is what any other word parses to.
constexpr EnumName<FinishReason> kFinishReasons[] = {
    {FinishReason::kStop, "stop"},      {FinishReason::kLength, "length"},     {FinishReason::kAbort, "abort"},
    {FinishReason::kError, "error"},    {FinishReason::kStop, "eos"},          {FinishReason::kStop, "stop_sequence"},
    {FinishReason::kStop, "end_turn"},  {FinishReason::kLength, "max_tokens"}, {FinishReason::kAbort, "cancelled"},
    {FinishReason::kAbort, "canceled"},
};

}  // namespace

std::string_view to_string(PauseMode mode) { return enum_name(kPauseModes, mode); }

std::optional<PauseMode> parse_pause_mode(std::string_view text) { return enum_value(kPauseModes, text); }

std::string_view to_string(FinishReason reason) { return enum_name(kFinishReasons, reason); }

FinishReason parse_finish_reason(std::string_view text) {
  return enum_value(kFinishReasons, text).value_or(FinishReason::kUnknown);
}

std::string Task::prompt_text() const {
  if (prompt) return *prompt;
  std::string out;
  for (const auto& m : messages) {
    if (!out.empty()) out += '\n';
    out += m.role;
    out += ": ";
    out += m.content;
  }
  return out;
}

nlohmann::json to_json(const ChatMessage& message) {
  nlohmann::json out = {{"role", message.role}, {"content", message.content}};
  if (!message.tool_calls.is_null()) out["tool_calls"] = message.tool_calls;
  if (!message.tool_call_id.empty()) out["tool_call_id"] = message.tool_call_id;
  if (!message.name.empty()) out["name"] = message.name;
  return out;
}

std::vector<nlohmann::json> to_json(const std::vector<ChatMessage>& messages) {
  std::vector<nlohmann::json> out;
  out.reserve(messages.size());
  for (const auto& m : messages) out.push_back(to_json(m));
  return out;
}

namespace {

// A message's content: a string, null, or an array of {"type": "text", "text"} parts.
std::optional<std::string> content_text(const nlohmann::json& content) {
  if (content.is_null()) return std::string();
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return std::nullopt;
  std::string out;
  for (const auto& part : content) {
    if (!part.is_object() || !part.contains("text") || !part["text"].is_string()) return std::nullopt;
    out += part["text"].get<std::string>();
  }
  return out;
}

// "tool_calls" with every call's function arguments as a string (an object is dumped).
std::expected<nlohmann::json, std::string> tool_calls_of(const nlohmann::json& calls) {
  if (calls.is_null()) return nlohmann::json();
  if (!calls.is_array()) return std::unexpected("tool_calls must be an array or null");
  nlohmann::json out = calls;
  for (std::size_t i = 0; i < out.size(); ++i) {
    auto& call = out[i];
    const auto where = "tool_calls[" + std::to_string(i) + "]";
    if (!call.is_object() || !call.contains("function") || !call["function"].is_object())
      return std::unexpected(where + " needs a 'function' object");
    auto& fn = call["function"];
    if (!fn.contains("name") || !fn["name"].is_string())
      return std::unexpected(where + ".function.name must be a string");
    if (fn.contains("arguments") && fn["arguments"].is_object()) fn["arguments"] = fn["arguments"].dump();
    if (!fn.contains("arguments") || !fn["arguments"].is_string())
      return std::unexpected(where + ".function.arguments must be a string (JSON) or an object");
    if (call.contains("id") && !call["id"].is_string()) return std::unexpected(where + ".id must be a string");
    if (!call.contains("type")) call["type"] = "function";
  }
  return out;
}

}  // namespace

std::expected<ChatMessage, std::string> chat_message_from_json(const nlohmann::json& j) {
  if (!j.is_object()) return std::unexpected("a message must be an object with 'role' and 'content'");
  if (!j.contains("role") || !j["role"].is_string()) return std::unexpected("role must be a string");
  ChatMessage m;
  m.role = j["role"].get<std::string>();
  auto text = content_text(j.value("content", nlohmann::json()));
  if (!text) return std::unexpected("content must be a string, null or an array of text parts");
  m.content = std::move(*text);
  auto calls = tool_calls_of(j.value("tool_calls", nlohmann::json()));
  if (!calls) return std::unexpected(calls.error());
  m.tool_calls = std::move(*calls);
  for (auto [key, field] : {std::pair{"tool_call_id", &m.tool_call_id}, std::pair{"name", &m.name}}) {
    if (!j.contains(key) || j[key].is_null()) continue;
    if (!j[key].is_string()) return std::unexpected(std::string(key) + " must be a string");
    *field = j[key].get<std::string>();
  }
  return m;
}

}  // namespace arlo
