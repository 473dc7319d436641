#pragma once
// Character escaping for the text formats arlo writes (Prometheus exposition, Markdown tables): one
// pass that replaces the characters a format reserves and keeps the rest. Pure; thread-safe.
#include <algorithm>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

namespace arlo {

// `text` with every character that `replacements` lists replaced by its text (the first entry for a
// character wins); other characters are kept as they are.
// escape_chars("a|b", {{'|', "\\|"}}) == "a\\|b".
inline std::string escape_chars(std::string_view text,
                                std::initializer_list<std::pair<char, std::string_view>> replacements) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    const auto* r =
        std::find_if(replacements.begin(), replacements.end(), [c](const auto& entry) { return entry.first == c; });
    if (r == replacements.end())
      out += c;
    else
      out += r->second;
  }
  return out;
}

}  // namespace arlo
