#pragma once
// Small text helpers of the config loader: "did you mean" suggestions and ${VAR} expansion.
// Pure functions; thread-safe.
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config/config.h"
#include "common/result.h"

namespace arlo::config {

// Optimal-string-alignment distance: insertions, deletions, substitutions and swaps of two
// neighbouring characters each cost 1.
std::size_t edit_distance(std::string_view a, std::string_view b);

// The candidate closest to `name`, when it is close enough to be a plausible typo (distance at most
// max(2, |name| / 3)); ties go to the earlier candidate.
std::optional<std::string> nearest(std::string_view name, const std::vector<std::string>& candidates);

// Replaces ${VAR} and ${VAR:-fallback} using `env`; "$${" is a literal "${". Errors name the variable
// ("environment variable RUN_NAME is not set (use ${RUN_NAME:-default} for a fallback)") or the
// malformed reference.
Result<std::string> expand_env(std::string_view text, const EnvLookup& env);

}  // namespace arlo::config
