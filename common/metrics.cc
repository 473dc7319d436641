#include "common/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "common/escape.h"
#include "common/log.h"

namespace arlo::metrics {
namespace {

// Prometheus text format floats: Go's ParseFloat spellings, with +Inf/-Inf/NaN.
std::string format_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);
}

// HELP text escaping (format 0.0.4): backslash and line feed.
std::string escape_help(const std::string& s) { return escape_chars(s, {{'\\', "\\\\"}, {'\n', "\\n"}}); }

void add_atomic(std::atomic<double>& a, double delta) { a.fetch_add(delta, std::memory_order_relaxed); }

}  // namespace

// Counters only go up: negative or NaN deltas are ignored rather than corrupting the series.
void Counter::inc(double delta) {
  if (!(delta >= 0.0)) return;
  add_atomic(value_, delta);
}

void Gauge::add(double delta) { add_atomic(value_, delta); }

Histogram::Histogram(std::vector<double> upper_bounds) : bounds_(std::move(upper_bounds)) {
  // Bounds must be finite and strictly increasing; +Inf is implicit.
  std::erase_if(bounds_, [](double b) { return !std::isfinite(b); });
  std::sort(bounds_.begin(), bounds_.end());
  bounds_.erase(std::unique(bounds_.begin(), bounds_.end()), bounds_.end());
  counts_ = std::make_unique<std::atomic<std::uint64_t>[]>(bounds_.size() + 1);
  for (std::size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::observe(double v) {
  if (std::isnan(v)) return;  // no bucket holds NaN; dropping it keeps sum meaningful
  // Bucket i counts bounds_[i-1] < v <= bounds_[i] (the `le` semantics).
  const auto i = static_cast<std::size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  add_atomic(sum_, v);
  count_.fetch_add(1, std::memory_order_relaxed);
}

std::vector<std::uint64_t> Histogram::bucket_counts() const {
  std::vector<std::uint64_t> out(bounds_.size() + 1);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = counts_[i].load(std::memory_order_relaxed);
  return out;
}

std::uint64_t Histogram::count() const { return count_.load(std::memory_order_relaxed); }
double Histogram::sum() const { return sum_.load(std::memory_order_relaxed); }

// Like Prometheus' histogram_quantile: find the bucket holding rank q*total and interpolate
// linearly inside it. The first bucket's lower edge is 0 (or its bound, if negative); a rank in
// the +Inf bucket reports the highest finite bound.
double Histogram::quantile(double q) const {
  const auto counts = bucket_counts();
  std::uint64_t total = 0;
  for (auto c : counts) total += c;
  if (total == 0) return 0.0;
  q = std::clamp(std::isnan(q) ? 0.0 : q, 0.0, 1.0);
  const double rank = q * static_cast<double>(total);
  double cumulative = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    const double in_bucket = static_cast<double>(counts[i]);
    if (in_bucket > 0 && cumulative + in_bucket >= rank) {
      if (i == bounds_.size()) return bounds_.empty() ? sum() / static_cast<double>(total) : bounds_.back();
      const double upper = bounds_[i];
      const double lower = i == 0 ? std::min(0.0, upper) : bounds_[i - 1];
      return lower + (upper - lower) * std::clamp((rank - cumulative) / in_bucket, 0.0, 1.0);
    }
    cumulative += in_bucket;
  }
  return bounds_.empty() ? 0.0 : bounds_.back();
}

void Histogram::reset() {
  for (std::size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
  sum_.store(0.0, std::memory_order_relaxed);
  count_.store(0, std::memory_order_relaxed);
}

std::vector<double> Histogram::exponential(double start, double factor, int count) {
  std::vector<double> out;
  double v = start;
  for (int i = 0; i < count; ++i) {
    out.push_back(v);
    v *= factor;
  }
  return out;
}

namespace {
// The entry's metric of one kind (its `slot`), made by `make` when the name is new. A name already
// registered as another kind is a programming error; rather than crash the process that serves
// /metrics we log it and hand back a detached metric (one per call site) that is never exported.
template <typename Entry, typename M, typename Make>
M& metric_of_kind(Entry& e, std::unique_ptr<M> Entry::*slot, const std::string& name, const std::string& help,
                  std::string_view kind, Make make) {
  if (e.empty()) {
    e.help = help;
    e.*slot = make();
  }
  if (e.*slot) return *(e.*slot);
  ARLO_ERROR("metric '{}' is not a {}; this update is not exported", name, kind);
  static const std::unique_ptr<M> detached = make();
  return *detached;
}
}  // namespace

Counter& Registry::counter(const std::string& name, const std::string& help) {
  std::lock_guard lock(mu_);
  return metric_of_kind(entries_[name], &Entry::counter, name, help, "counter",
                        [] { return std::make_unique<Counter>(); });
}

Gauge& Registry::gauge(const std::string& name, const std::string& help) {
  std::lock_guard lock(mu_);
  return metric_of_kind(entries_[name], &Entry::gauge, name, help, "gauge", [] { return std::make_unique<Gauge>(); });
}

namespace {
// {a="x",b="y"} with the exposition format's escapes (backslash, double quote, newline).
std::string render_labels(const Labels& labels) {
  std::string out = "{";
  for (const auto& [k, v] : labels) {
    if (out.size() > 1) out += ',';
    out += k + "=\"" + escape_chars(v, {{'\\', "\\\\"}, {'"', "\\\""}, {'\n', "\\n"}}) + '"';
  }
  return out + "}";
}
}  // namespace

Gauge& Registry::gauge(const std::string& name, const Labels& labels, const std::string& help) {
  std::lock_guard lock(mu_);
  Entry& e = entries_[name];
  if (e.empty()) e.help = help;
  if (!e.counter && !e.gauge && !e.histogram) {
    auto& g = e.series[render_labels(labels)];
    if (!g) g = std::make_unique<Gauge>();
    return *g;
  }
  ARLO_ERROR("metric '{}' is not a labelled gauge; this update is not exported", name);
  static Gauge detached;
  return detached;
}

Histogram& Registry::histogram(const std::string& name, std::vector<double> bounds, const std::string& help) {
  std::lock_guard lock(mu_);
  return metric_of_kind(entries_[name], &Entry::histogram, name, help, "histogram",
                        [&bounds] { return std::make_unique<Histogram>(std::move(bounds)); });
}

std::string Registry::prometheus_name(const std::string& name) {
  std::string out = "arlo_";
  out.reserve(5 + name.size());
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    out += ok ? c : '_';
  }
  return out;
}

std::string Registry::prometheus() const {
  std::lock_guard lock(mu_);
  std::string out;
  std::set<std::string> emitted;
  for (const auto& [name, e] : entries_) {
    const std::string pname = prometheus_name(name);
    // Two names that sanitise alike ("a/b", "a_b") would make an invalid exposition: keep the first.
    if (!emitted.insert(pname).second) {
      ARLO_WARN_EVERY(60.0, "metric '{}' maps to Prometheus name {} already used; not exported", name, pname);
      continue;
    }
    out += "# HELP " + pname + " " + escape_help(e.help.empty() ? name : e.help) + "\n";
    if (!e.series.empty()) {
      out += "# TYPE " + pname + " gauge\n";
      for (const auto& [labels, g] : e.series) out += pname + labels + " " + format_value(g->value()) + "\n";
    } else if (e.counter) {
      out += "# TYPE " + pname + " counter\n";
      out += pname + " " + format_value(e.counter->value()) + "\n";
    } else if (e.gauge) {
      out += "# TYPE " + pname + " gauge\n";
      out += pname + " " + format_value(e.gauge->value()) + "\n";
    } else if (e.histogram) {
      const Histogram& h = *e.histogram;
      out += "# TYPE " + pname + " histogram\n";
      const auto counts = h.bucket_counts();
      std::uint64_t cumulative = 0;
      for (std::size_t i = 0; i < counts.size(); ++i) {
        cumulative += counts[i];
        const std::string le = i < h.bounds().size() ? format_value(h.bounds()[i]) : "+Inf";
        out += pname + "_bucket{le=\"" + le + "\"} " + std::to_string(cumulative) + "\n";
      }
      // _count equals the +Inf bucket even while observers race with this read.
      out += pname + "_sum " + format_value(h.sum()) + "\n";
      out += pname + "_count " + std::to_string(cumulative) + "\n";
    }
  }
  return out;
}

nlohmann::json Registry::snapshot() const {
  std::lock_guard lock(mu_);
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, e] : entries_) {
    for (const auto& [labels, g] : e.series) out[name + labels] = g->value();
    if (e.counter) {
      out[name] = e.counter->value();
    } else if (e.gauge) {
      out[name] = e.gauge->value();
    } else if (e.histogram) {
      out[name + "/p50"] = e.histogram->quantile(0.5);
      out[name + "/p99"] = e.histogram->quantile(0.99);
      out[name + "/count"] = e.histogram->count();
      out[name + "/sum"] = e.histogram->sum();
    }
  }
  return out;
}

}  // namespace arlo::metrics
