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

}  // namespace arlo
