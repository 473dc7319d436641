#pragma once
// Enum <-> name tables: one table per enum gives both its to_string and its parse, so that the two
// cannot disagree and a new value is one new row:
//
//   constexpr EnumName<PauseMode> kPauseModes[] = {{PauseMode::kKeep, "keep"}, {PauseMode::kWait, "wait"}};
//   std::string_view to_string(PauseMode m) { return enum_name(kPauseModes, m); }
//   std::optional<PauseMode> parse_pause_mode(std::string_view s) { return enum_value(kPauseModes, s); }
//
// A table may list a value more than once: its first row is its name, the later rows are aliases
// that only parsing accepts ("eos" for FinishReason::kStop).
#include <cstddef>
#include <optional>
#include <string_view>

namespace arlo {

template <typename E>
struct EnumName {
  E value;
  std::string_view name;
};

// The name of `value` (its first row in `table`); `fallback` when no row has it.
template <typename E, std::size_t N>
constexpr std::string_view enum_name(const EnumName<E> (&table)[N], E value, std::string_view fallback = "unknown") {
  for (const auto& row : table)
    if (row.value == value) return row.name;
  return fallback;
}

// The value a row of `table` names `name` (exactly, case and all); nullopt when none does.
template <typename E, std::size_t N>
constexpr std::optional<E> enum_value(const EnumName<E> (&table)[N], std::string_view name) {
  for (const auto& row : table)
    if (row.name == name) return row.value;
  return std::nullopt;
}

}  // namespace arlo
