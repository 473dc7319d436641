// Metrics registry: the numbers, the Prometheus text exposition (format 0.0.4) and the JSON
// snapshot written to metrics.jsonl.
#include "common/metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <regex>
#include <sstream>
#include <thread>

namespace arlo::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(MetricsName, PrometheusNamesArePrefixedAndSanitised) {
  EXPECT_EQ(Registry::prometheus_name("train/reward/mean"), "arlo_train_reward_mean");
  EXPECT_EQ(Registry::prometheus_name("eval/gsm8k/pass@4"), "arlo_eval_gsm8k_pass_4");
  EXPECT_EQ(Registry::prometheus_name("weight_sync/seconds"), "arlo_weight_sync_seconds");
  EXPECT_EQ(Registry::prometheus_name("a-b.c d:é"), "arlo_a_b_c_d___");  // é is two bytes
  EXPECT_EQ(Registry::prometheus_name("9lives"), "arlo_9lives");
}

TEST(MetricsValues, CounterGaugeBasics) {
  Counter c;
  c.inc();
  c.inc(2.5);
  c.inc(-10);  // counters never go down
  c.inc(std::numeric_limits<double>::quiet_NaN());
  EXPECT_DOUBLE_EQ(c.value(), 3.5);
  Gauge g;
  g.set(4);
  g.add(-1.5);
  EXPECT_DOUBLE_EQ(g.value(), 2.5);
}

TEST(MetricsValues, HistogramBucketsSumCountAndReset) {
  Histogram h({1.0, 0.1, 10.0, 1.0, std::numeric_limits<double>::infinity()});  // unsorted, duplicate, inf
  EXPECT_EQ(h.bounds(), (std::vector<double>{0.1, 1.0, 10.0}));
  for (double v : {0.05, 0.1, 0.5, 1.0, 5.0, 50.0, 500.0}) h.observe(v);
  h.observe(std::numeric_limits<double>::quiet_NaN());                     // ignored
  EXPECT_EQ(h.bucket_counts(), (std::vector<std::uint64_t>{2, 2, 1, 2}));  // le semantics: 0.1 is in the first
  EXPECT_EQ(h.count(), 7u);
  EXPECT_DOUBLE_EQ(h.sum(), 556.65);
  h.reset();
  EXPECT_EQ(h.count(), 0u);
  EXPECT_EQ(h.sum(), 0.0);
  EXPECT_EQ(h.bucket_counts(), (std::vector<std::uint64_t>{0, 0, 0, 0}));
  EXPECT_EQ(h.quantile(0.5), 0.0);
}

TEST(MetricsValues, HistogramQuantileInterpolates) {
  Histogram h({10, 20, 30, 40});
  for (int i = 0; i < 10; ++i) h.observe(15);  // all in (10, 20]
  EXPECT_DOUBLE_EQ(h.quantile(0.5), 15.0);
  EXPECT_DOUBLE_EQ(h.quantile(1.0), 20.0);
  EXPECT_DOUBLE_EQ(h.quantile(0.0), 10.0);
  Histogram g({1, 2, 4});
  for (int i = 0; i < 50; ++i) g.observe(0.5);  // first bucket: lower edge 0
  for (int i = 0; i < 50; ++i) g.observe(3);    // (2, 4]
  EXPECT_DOUBLE_EQ(g.quantile(0.25), 0.5);
  EXPECT_DOUBLE_EQ(g.quantile(0.75), 3.0);
  g.observe(1000);  // +Inf bucket reports the top finite bound
  EXPECT_DOUBLE_EQ(g.quantile(1.0), 4.0);
  EXPECT_DOUBLE_EQ(g.quantile(7.0), 4.0);  // q is clamped
}

TEST(MetricsValues, ExponentialBounds) {
  using ::testing::DoubleEq;
  EXPECT_THAT(Histogram::exponential(0.001, 10, 4),
              ::testing::ElementsAre(DoubleEq(0.001), DoubleEq(0.01), DoubleEq(0.1), DoubleEq(1.0)));
  EXPECT_THAT(Histogram::exponential(1, 2, 5), ::testing::ElementsAre(1, 2, 4, 8, 16));
  EXPECT_TRUE(Histogram::exponential(1, 2, 0).empty());
}

TEST(MetricsRegistry, SameNameReturnsSameMetricAndKeepsFirstHelp) {
  Registry r;
  Counter& a = r.counter("rollouts/completed", "rollouts that completed");
  Counter& b = r.counter("rollouts/completed", "ignored");
  EXPECT_EQ(&a, &b);
  Histogram& h1 = r.histogram("lat", {1, 2});
  Histogram& h2 = r.histogram("lat", {5});
  EXPECT_EQ(&h1, &h2);
  EXPECT_EQ(h2.bounds(), (std::vector<double>{1, 2}));
  EXPECT_THAT(r.prometheus(), HasSubstr("# HELP arlo_rollouts_completed rollouts that completed\n"));
}

TEST(MetricsRegistry, PrometheusExpositionExactText) {
  Registry r;
  r.counter("rollouts/completed", "Rollouts that completed.").inc(3);
  r.gauge("throughput/tokens_per_s", "Generated tokens per second.").set(1234.5);
  auto& h = r.histogram("weight_sync/seconds", {0.5, 1, 2.5}, "Weight sync duration.\nSeconds \\ wall.");
  h.observe(0.25);
  h.observe(0.75);
  h.observe(2);
  h.observe(100);
  const std::string expected =
      "# HELP arlo_rollouts_completed Rollouts that completed.\n"
      "# TYPE arlo_rollouts_completed counter\n"
      "arlo_rollouts_completed 3\n"
      "# HELP arlo_throughput_tokens_per_s Generated tokens per second.\n"
      "# TYPE arlo_throughput_tokens_per_s gauge\n"
      "arlo_throughput_tokens_per_s 1234.5\n"
      "# HELP arlo_weight_sync_seconds Weight sync duration.\\nSeconds \\\\ wall.\n"
      "# TYPE arlo_weight_sync_seconds histogram\n"
      "arlo_weight_sync_seconds_bucket{le=\"0.5\"} 1\n"
      "arlo_weight_sync_seconds_bucket{le=\"1\"} 2\n"
      "arlo_weight_sync_seconds_bucket{le=\"2.5\"} 3\n"
      "arlo_weight_sync_seconds_bucket{le=\"+Inf\"} 4\n"
      "arlo_weight_sync_seconds_sum 103\n"
      "arlo_weight_sync_seconds_count 4\n";
  EXPECT_EQ(r.prometheus(), expected);
}

TEST(MetricsRegistry, LabelledGaugesAreOneFamilyWithEscapedLabels) {
  Registry r;
  r.gauge("worker/version", {{"worker", "http://127.0.0.1:8001"}}, "Version each worker holds.").set(7);
  r.gauge("worker/version", {{"worker", "odd\"name\\\n"}}).set(6);
  r.gauge("worker/version", {{"worker", "http://127.0.0.1:8001"}}).add(1);
  const std::string expected =
      "# HELP arlo_worker_version Version each worker holds.\n"
      "# TYPE arlo_worker_version gauge\n"
      "arlo_worker_version{worker=\"http://127.0.0.1:8001\"} 8\n"
      "arlo_worker_version{worker=\"odd\\\"name\\\\\\n\"} 6\n";
  EXPECT_EQ(r.prometheus(), expected);
  EXPECT_EQ(r.snapshot()["worker/version{worker=\"http://127.0.0.1:8001\"}"], 8.0);
  // A labelled family is not also a plain gauge, and the reverse.
  r.gauge("worker/version").set(1);
  r.gauge("plain").set(1);
  r.gauge("plain", {{"a", "b"}}).set(2);
  EXPECT_EQ(r.prometheus().find("arlo_worker_version 1"), std::string::npos);
  EXPECT_EQ(r.prometheus().find("arlo_plain{"), std::string::npos);
}

// Every line is a comment (HELP/TYPE) or `name{labels} value` with a valid name and a value Go's
// ParseFloat accepts; each family's HELP and TYPE precede its samples.
TEST(MetricsRegistry, ExpositionIsWellFormedForAwkwardNamesAndValues) {
  Registry r;
  r.gauge("eval/math-500/pass@8").set(std::numeric_limits<double>::infinity());
  r.gauge("weird value").set(std::numeric_limits<double>::quiet_NaN());
  r.gauge("neg").set(-std::numeric_limits<double>::infinity());
  r.gauge("tiny").set(1e-300);
  r.counter("big").inc(1e300);
  r.histogram("empty_hist", {});
  const std::string text = r.prometheus();
  const std::regex sample(R"(^[a-zA-Z_:][a-zA-Z0-9_:]*(\{le="[^"]*"\})? (\+Inf|-Inf|NaN|-?[0-9.]+(e[+-][0-9]+)?)$)");
  const std::regex comment(R"(^# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* .*$)");
  std::istringstream lines(text);
  std::string line, family;
  int samples = 0;
  while (std::getline(lines, line)) {
    if (line.starts_with("#")) {
      EXPECT_TRUE(std::regex_match(line, comment)) << line;
    } else {
      EXPECT_TRUE(std::regex_match(line, sample)) << line;
      ++samples;
    }
  }
  EXPECT_EQ(samples, 5 + 3);  // five single samples; the empty histogram has +Inf bucket, sum, count
  EXPECT_THAT(text, HasSubstr("arlo_eval_math_500_pass_8 +Inf\n"));
  EXPECT_THAT(text, HasSubstr("arlo_weird_value NaN\n"));
  EXPECT_THAT(text, HasSubstr("arlo_neg -Inf\n"));
  EXPECT_THAT(text, HasSubstr("# HELP arlo_weird_value weird value\n"));  // default help: the name
  EXPECT_THAT(text, HasSubstr("arlo_empty_hist_bucket{le=\"+Inf\"} 0\n"));
}

TEST(MetricsRegistry, KindConflictsAndNameCollisionsAreNotExported) {
  Registry r;
  r.gauge("x").set(1);
  Counter& wrong = r.counter("x");  // a programming error: gets a detached counter
  wrong.inc(100);
  EXPECT_THAT(r.prometheus(), HasSubstr("# TYPE arlo_x gauge\narlo_x 1\n"));
  EXPECT_THAT(r.prometheus(), Not(HasSubstr("100")));
  r.gauge("a/b").set(1);
  r.gauge("a_b").set(2);  // same Prometheus name: only the first (in name order) is exported
  const std::string text = r.prometheus();
  EXPECT_THAT(text, HasSubstr("arlo_a_b 1\n"));
  EXPECT_THAT(text, Not(HasSubstr("arlo_a_b 2\n")));
  EXPECT_EQ(r.snapshot()["a_b"], 2.0);  // the JSON view keeps both: its names are distinct
}

TEST(MetricsRegistry, JsonSnapshotUsesDesignNames) {
  Registry r;
  r.gauge("train/reward/mean").set(0.75);
  r.counter("rollouts/failed").inc(2);
  auto& h = r.histogram("time/step_seconds", {1, 2, 4});
  for (int i = 0; i < 100; ++i) h.observe(1.5);
  const nlohmann::json snap = r.snapshot();
  EXPECT_EQ(snap["train/reward/mean"], 0.75);
  EXPECT_EQ(snap["rollouts/failed"], 2.0);
  EXPECT_DOUBLE_EQ(snap["time/step_seconds/p50"].get<double>(), 1.5);
  EXPECT_DOUBLE_EQ(snap["time/step_seconds/p99"].get<double>(), 1.99);
  EXPECT_EQ(snap["time/step_seconds/count"], 100u);
  EXPECT_DOUBLE_EQ(snap["time/step_seconds/sum"].get<double>(), 150.0);
  EXPECT_EQ(snap.size(), 6u);
  // One line of metrics.jsonl.
  EXPECT_EQ(snap.dump().find('\n'), std::string::npos);
}

TEST(MetricsRegistry, ConcurrentUpdatesLoseNothing) {
  Registry r;
  Counter& c = r.counter("c");
  Gauge& g = r.gauge("g");
  Histogram& h = r.histogram("h", {0.5, 1.5});
  constexpr int kThreads = 4, kPerThread = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        c.inc();
        g.add(1);
        h.observe(t % 2);                         // 0 or 1
        if (i % 1000 == 0) (void)r.prometheus();  // readers race with writers
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(c.value(), kThreads * kPerThread);
  EXPECT_EQ(g.value(), kThreads * kPerThread);
  EXPECT_EQ(h.count(), static_cast<std::uint64_t>(kThreads * kPerThread));
  EXPECT_EQ(h.bucket_counts(), (std::vector<std::uint64_t>{2 * kPerThread, 2 * kPerThread, 0}));
  EXPECT_EQ(h.sum(), 2.0 * kPerThread);
}

}  // namespace
}  // namespace arlo::metrics
