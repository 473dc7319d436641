#include "common/vocabulary.h"

namespace arlo {

std::string_view to_string(PauseMode mode) {
  switch (mode) {
    case PauseMode::kKeep: return "keep";
    case PauseMode::kWait: return "wait";
    case PauseMode::kAbort: return "abort";
  }
  return "unknown";
}

std::optional<PauseMode> parse_pause_mode(std::string_view text) {
  if (text == "keep") return PauseMode::kKeep;
  if (text == "wait") return PauseMode::kWait;
  if (text == "abort") return PauseMode::kAbort;
  return std::nullopt;
}

std::string_view to_string(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kError: return "error";
    case FinishReason::kUnknown: break;
  }
  return "unknown";
}

FinishReason parse_finish_reason(std::string_view text) {
  if (text == "stop" || text == "eos" || text == "stop_sequence" || text == "end_turn") return FinishReason::kStop;
  if (text == "length" || text == "max_tokens") return FinishReason::kLength;
  if (text == "abort" || text == "cancelled" || text == "canceled") return FinishReason::kAbort;
  if (text == "error") return FinishReason::kError;
  return FinishReason::kUnknown;
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

}  // namespace arlo
