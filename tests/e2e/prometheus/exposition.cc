#include "tests/e2e/prometheus/exposition.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <set>
#include <sstream>
#include <utility>

namespace arlo::e2e {
namespace {

bool is_metric_name(std::string_view s) {
  if (s.empty()) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

bool is_label_name(std::string_view s) {
  if (s.empty() || s.starts_with("__")) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

// A sample value as Prometheus reads it: a float, NaN, +Inf or -Inf.
bool parse_value(const std::string& s, double& out) {
  if (s == "NaN") return out = std::nan(""), true;
  if (s == "+Inf" || s == "Inf") return out = HUGE_VAL, true;
  if (s == "-Inf") return out = -HUGE_VAL, true;
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  out = std::strtod(s.c_str(), &end);
  return errno == 0 && end == s.c_str() + s.size() && std::isfinite(out);
}

std::string series_key(const Sample& s) {
  std::string k = s.name;
  for (const auto& [n, v] : s.labels) k += "\x1f" + n + "=" + v;
  return k;
}

std::string_view strip_suffix(std::string_view name, std::string_view suffix) {
  return name.ends_with(suffix) ? name.substr(0, name.size() - suffix.size()) : std::string_view{};
}

// The family a sample belongs to: histogram and summary samples carry _bucket, _sum, _count.
std::string family_of(const std::string& name, const std::map<std::string, std::string>& types) {
  for (std::string_view suffix : {"_bucket", "_sum", "_count"}) {
    const auto base = strip_suffix(name, suffix);
    if (base.empty()) continue;
    const auto t = types.find(std::string(base));
    if (t != types.end() && (t->second == "histogram" || (t->second == "summary" && suffix != "_bucket")))
      return std::string(base);
  }
  return name;
}

// name{labels} value [timestamp]
std::expected<Sample, std::string> parse_sample(std::string_view line) {
  Sample s;
  std::size_t i = 0;
  while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
  s.name = std::string(line.substr(0, i));
  if (!is_metric_name(s.name)) return std::unexpected("invalid metric name '" + s.name + "'");
  if (i < line.size() && line[i] == '{') {
    ++i;
    while (true) {
      if (i < line.size() && line[i] == '}') {
        ++i;
        break;
      }
      std::size_t eq = line.find('=', i);
      if (eq == std::string_view::npos) return std::unexpected("label without '=' in " + s.name);
      const std::string lname(line.substr(i, eq - i));
      if (!is_label_name(lname)) return std::unexpected("invalid label name '" + lname + "' in " + s.name);
      i = eq + 1;
      if (i >= line.size() || line[i] != '"')
        return std::unexpected("label " + lname + " of " + s.name + ": value not quoted");
      ++i;
      std::string value;
      bool closed = false;
      while (i < line.size()) {
        const char c = line[i++];
        if (c == '"') {
          closed = true;
          break;
        }
        if (c == '\\') {
          if (i >= line.size()) break;
          const char e = line[i++];
          if (e == 'n')
            value += '\n';
          else if (e == '\\' || e == '"')
            value += e;
          else
            return std::unexpected("label " + lname + " of " + s.name + ": invalid escape \\" + std::string(1, e));
          continue;
        }
        value += c;
      }
      if (!closed) return std::unexpected("label " + lname + " of " + s.name + ": unterminated value");
      if (!s.labels.emplace(lname, value).second) return std::unexpected("label " + lname + " twice in " + s.name);
      if (i < line.size() && line[i] == ',')
        ++i;
      else if (i >= line.size() || line[i] != '}')
        return std::unexpected("expected ',' or '}' after label " + lname + " of " + s.name);
    }
  }
  if (i >= line.size() || line[i] != ' ') return std::unexpected("expected a space before the value of " + s.name);
  std::istringstream rest{std::string(line.substr(i + 1))};
  std::string value, timestamp, extra;
  rest >> value >> timestamp >> extra;
  if (!parse_value(value, s.value)) return std::unexpected("value of " + s.name + " is not a number: '" + value + "'");
  if (!timestamp.empty()) {
    char* end = nullptr;
    std::strtoll(timestamp.c_str(), &end, 10);
    if (*end != '\0') return std::unexpected("timestamp of " + s.name + " is not an integer: '" + timestamp + "'");
  }
  if (!extra.empty()) return std::unexpected("trailing text after the sample of " + s.name + ": '" + extra + "'");
  return s;
}

// Histogram families: per label set (without le), buckets in increasing le with non-decreasing
// counts, a +Inf bucket equal to _count, and a _sum.
std::string check_histogram(const std::string& family, const std::vector<Sample>& samples) {
  struct Series {
    std::vector<std::pair<double, double>> buckets;  // (le, cumulative count)
    bool has_sum = false, has_count = false;
    double count = 0;
  };
  std::map<std::map<std::string, std::string>, Series> series;
  for (const auto& s : samples) {
    auto labels = s.labels;
    if (s.name == family + "_bucket") {
      const auto le = labels.find("le");
      double bound = 0;
      if (le == labels.end() || !parse_value(le->second, bound)) return family + "_bucket without a numeric le label";
      labels.erase("le");
      series[labels].buckets.emplace_back(bound, s.value);
    } else if (s.name == family + "_sum") {
      series[labels].has_sum = true;
    } else if (s.name == family + "_count") {
      series[labels].has_count = true;
      series[labels].count = s.value;
    } else {
      return "sample " + s.name + " in histogram " + family;
    }
  }
  for (const auto& [labels, h] : series) {
    if (!h.has_sum || !h.has_count) return "histogram " + family + " lacks _sum or _count";
    if (h.buckets.empty() || !std::isinf(h.buckets.back().first)) return "histogram " + family + " lacks a +Inf bucket";
    for (std::size_t i = 1; i < h.buckets.size(); ++i)
      if (h.buckets[i].first <= h.buckets[i - 1].first || h.buckets[i].second < h.buckets[i - 1].second)
        return "histogram " + family + ": buckets not in increasing le with cumulative counts";
    if (h.buckets.back().second != h.count) return "histogram " + family + ": +Inf bucket differs from _count";
  }
  return {};
}

}  // namespace

std::vector<Sample> Exposition::named(std::string_view name) const {
  std::vector<Sample> out;
  for (const auto& s : samples)
    if (s.name == name) out.push_back(s);
  return out;
}

std::expected<Exposition, std::string> parse_exposition(std::string_view text) {
  if (text.empty()) return std::unexpected("empty exposition");
  if (text.back() != '\n') return std::unexpected("the exposition does not end with a line feed");
  Exposition out;
  std::set<std::string> helped, families_done, series;
  std::map<std::string, std::vector<Sample>> histogram_samples;
  std::string current;  // the family whose samples come last
  std::size_t line_no = 0;
  std::size_t pos = 0;
  auto fail = [&](const std::string& what) { return std::unexpected("line " + std::to_string(line_no) + ": " + what); };
  while (pos < text.size()) {
    const std::size_t nl = text.find('\n', pos);
    const std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    if (line.empty()) continue;
    if (line.front() == '#') {
      std::istringstream in{std::string(line)};
      std::string hash, keyword, name, rest;
      in >> hash >> keyword >> name;
      if (hash != "#" || (keyword != "HELP" && keyword != "TYPE")) continue;  // a comment
      if (!is_metric_name(name)) return fail("invalid metric name '" + name + "' in " + keyword);
      if (families_done.contains(name) || current == name) return fail(keyword + " " + name + " after its samples");
      if (keyword == "HELP") {
        if (!helped.insert(name).second) return fail("a second HELP for " + name);
        continue;
      }
      in >> rest;
      std::string extra;
      in >> extra;
      static const std::set<std::string> kTypes = {"counter", "gauge", "histogram", "summary", "untyped"};
      if (!kTypes.contains(rest) || !extra.empty()) return fail("TYPE " + name + ": unknown type '" + rest + "'");
      if (!out.types.emplace(name, rest).second) return fail("a second TYPE for " + name);
      continue;
    }
    auto sample = parse_sample(line);
    if (!sample) return fail(sample.error());
    const std::string family = family_of(sample->name, out.types);
    if (family != current) {
      if (families_done.contains(family)) return fail("the samples of " + family + " are not contiguous");
      if (!current.empty()) families_done.insert(current);
      current = family;
    }
    const auto type = out.types.find(family);
    if (type != out.types.end() && (type->second == "counter" || type->second == "gauge") && sample->name != family)
      return fail(sample->name + " in " + type->second + " family " + family);
    if (type != out.types.end() && type->second == "counter" && sample->value < 0)
      return fail("counter " + family + " is negative");
    if (!series.insert(series_key(*sample)).second)
      return fail("series " + std::string(line.substr(0, line.rfind(' '))) + " twice");
    if (type != out.types.end() && type->second == "histogram") histogram_samples[family].push_back(*sample);
    out.samples.push_back(std::move(*sample));
  }
  for (const auto& [family, samples] : histogram_samples)
    if (auto err = check_histogram(family, samples); !err.empty()) return std::unexpected(err);
  return out;
}

}  // namespace arlo::e2e
