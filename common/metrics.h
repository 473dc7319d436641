#pragma once
// A registry of counters, gauges and histograms with two views: Prometheus text exposition
// (`/metrics`, names prefixed `arlo_`, '/' and other invalid characters turned into '_') and a JSON
// snapshot for `metrics.jsonl` (docs/watching-a-run.md; names like "train/reward/mean").
//
// Thread-safety: all methods are safe from any thread. Metric handles returned by the registry stay
// valid for the registry's lifetime; updating them is lock-free.
#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace arlo::metrics {

class Counter {
 public:
  void inc(double delta = 1.0);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Gauge {
 public:
  void set(double v) { value_.store(v, std::memory_order_relaxed); }
  void add(double delta);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Fixed upper bounds, cumulative buckets as Prometheus expects; quantile() interpolates inside a
// bucket (good enough for p50/p99 of latencies).
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double v);
  double quantile(double q) const;  // 0 when empty
  std::uint64_t count() const;
  double sum() const;
  const std::vector<double>& bounds() const { return bounds_; }
  std::vector<std::uint64_t> bucket_counts() const;  // per bucket, not cumulative; last is +Inf
  void reset();

  // Exponential bounds start, start*factor, ... (count of them).
  static std::vector<double> exponential(double start, double factor, int count);

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> counts_;  // bounds_.size() + 1
  std::atomic<double> sum_{0.0};
  std::atomic<std::uint64_t> count_{0};
};

// Label name -> value, for the series of one labelled family.
using Labels = std::map<std::string, std::string>;

class Registry {
 public:
  // Returns the metric with this name, creating it on first use. `help` is kept from the first call.
  Counter& counter(const std::string& name, const std::string& help = "");
  Gauge& gauge(const std::string& name, const std::string& help = "");
  // One series of a labelled gauge family, e.g. gauge("weight_sync/worker_seconds", {{"worker", url}}):
  // arlo_weight_sync_worker_seconds{worker="..."}. A family is either labelled or plain.
  Gauge& gauge(const std::string& name, const Labels& labels, const std::string& help = "");
  Histogram& histogram(const std::string& name, std::vector<double> bounds, const std::string& help = "");

  // Prometheus text format 0.0.4.
  std::string prometheus() const;
  // {"name": value, ...}; histograms appear as name/p50, name/p99, name/count, name/sum; labelled
  // series as name{label="value"}.
  nlohmann::json snapshot() const;

  // "train/reward/mean" -> "arlo_train_reward_mean"
  static std::string prometheus_name(const std::string& name);

 private:
  struct Entry {
    std::string help;
    std::unique_ptr<Counter> counter;
    std::unique_ptr<Gauge> gauge;
    std::unique_ptr<Histogram> histogram;
    std::map<std::string, std::unique_ptr<Gauge>> series;  // labelled gauges: rendered labels -> gauge
    bool empty() const { return !counter && !gauge && !histogram && series.empty(); }
  };
  mutable std::mutex mu_;
  std::map<std::string, Entry> entries_;
};

}  // namespace arlo::metrics
