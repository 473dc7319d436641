#include "config/text.h"

#include <algorithm>

namespace arlo::config {

std::size_t edit_distance(std::string_view a, std::string_view b) {
  // Three rolling rows: the swap case looks two rows back.
  const std::size_t n = b.size();
  std::vector<std::size_t> two_back(n + 1), prev(n + 1), cur(n + 1);
  for (std::size_t j = 0; j <= n; ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= n; ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        cur[j] = std::min(cur[j], two_back[j - 2] + 1);
      }
    }
    std::swap(two_back, prev);
    std::swap(prev, cur);
  }
  return prev[n];
}

std::optional<std::string> nearest(std::string_view name, const std::vector<std::string>& candidates) {
  const std::size_t limit = std::max<std::size_t>(2, name.size() / 3);
  std::optional<std::string> best;
  std::size_t best_distance = limit + 1;
  for (const auto& candidate : candidates) {
    const std::size_t d = edit_distance(name, candidate);
    if (d < best_distance) {
      best_distance = d;
      best = candidate;
    }
  }
  return best;
}

namespace {

bool is_name_char(char c, bool first) {
  const bool alpha = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
  return first ? alpha : alpha || (c >= '0' && c <= '9');
}

}  // namespace

Result<std::string> expand_env(std::string_view text, const EnvLookup& env) {
  std::string out;
  out.reserve(text.size());
  std::size_t i = 0;
  while (i < text.size()) {
    if (text.compare(i, 3, "$${") == 0) {
      out += "${";
      i += 3;
      continue;
    }
    if (text.compare(i, 2, "${") != 0) {
      out += text[i++];
      continue;
    }
    const std::size_t close = text.find('}', i + 2);
    if (close == std::string_view::npos) {
      return make_error(ErrorCode::kInvalidArgument,
                        "unterminated '${' in '" + std::string(text) + "' (write $${ for a literal ${)");
    }
    const std::string_view body = text.substr(i + 2, close - i - 2);
    const std::size_t sep = body.find(":-");
    const std::string_view name = body.substr(0, sep);
    bool valid = !name.empty();
    for (std::size_t k = 0; k < name.size() && valid; ++k) valid = is_name_char(name[k], k == 0);
    if (!valid) {
      return make_error(
          ErrorCode::kInvalidArgument,
          "'${" + std::string(body) + "}' is not a valid environment reference (use ${NAME} or ${NAME:-fallback})");
    }
    std::optional<std::string> value = env ? env(name) : std::nullopt;
    if (sep != std::string_view::npos) {
      if (!value || value->empty()) value = std::string(body.substr(sep + 2));
    } else if (!value) {
      return make_error(ErrorCode::kInvalidArgument, "environment variable " + std::string(name) +
                                                         " is not set (use ${" + std::string(name) +
                                                         ":-default} for a fallback)");
    }
    out += *value;
    i = close + 1;
  }
  return out;
}

}  // namespace arlo::config
