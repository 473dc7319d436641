#pragma once
// A strict reader of the Prometheus text exposition format (0.0.4), for checking what arlo serves on
// /metrics: every line is a HELP, TYPE, comment or sample line; a family has at most one HELP and one
// TYPE, both before its samples; a family's samples are contiguous; names, labels and values are
// well formed; no series appears twice; histogram buckets are cumulative and end in +Inf = _count.
#include <expected>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace arlo::e2e {

struct Sample {
  std::string name;                           // arlo_weight_sync_worker_seconds
  std::map<std::string, std::string> labels;  // {"worker": "http://127.0.0.1:41137"}, unescaped
  double value = 0.0;
};

struct Exposition {
  std::map<std::string, std::string> types;  // family -> counter | gauge | histogram | summary | untyped
  std::vector<Sample> samples;               // in text order

  // The samples named `name`.
  std::vector<Sample> named(std::string_view name) const;
};

// The parsed text, or what is wrong and on which line ("line 12: ...").
std::expected<Exposition, std::string> parse_exposition(std::string_view text);

}  // namespace arlo::e2e
