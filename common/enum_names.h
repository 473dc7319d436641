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
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "common/registry.h"
#include "common/result.h"

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

// The value a row of `table` names `name`; otherwise kInvalidArgument listing each value's name
// (not the aliases): "unknown <what> 'x': use a, b or c".
template <typename E, std::size_t N>
Result<E> parse_enum(const EnumName<E> (&table)[N], std::string_view what, std::string_view name) {
  if (auto value = enum_value(table, name)) return *value;
  std::vector<std::string> names;
  for (const auto& row : table)
    if (enum_name(table, row.value) == row.name) names.emplace_back(row.name);
  return make_error(ErrorCode::kInvalidArgument, fmt::format("unknown {} '{}': use {}", what, name, join_names(names)));
}

}  // namespace arlo
