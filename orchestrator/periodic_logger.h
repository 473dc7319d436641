#pragma once
// PeriodicLogger: every log.interval seconds, one line with the pipeline view (rollouts in flight,
// groups queued, tokens/s, staleness, last weight-sync time, event-loop lag p50/p99), the same
// figures as gauges for /metrics and as a JSON object for metrics.jsonl.
//
// LagProbe: measures event-loop lag, the delay between when a timer was due and when the loop got
// to run it. Under load this is how long any handler waits behind others: the loop's latency.
//
// Threading: the io_context thread only.
#include <boost/asio/any_io_executor.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/async/coro.h"
#include "orchestrator/ports.h"

namespace arlo::orch {

class LagProbe {
 public:
  LagProbe(Clock& clock, Duration period) : clock_(clock), period_(period) {}
  void start();
  void stop();
  // p50 / p99 in seconds over the samples since the last take(), then starts a new window.
  struct Window {
    double p50 = 0.0;
    double p99 = 0.0;
    double max = 0.0;
    std::size_t samples = 0;
  };
  Window take();

 private:
  void arm();
  Clock& clock_;
  Duration period_;
  std::unique_ptr<Timer> timer_;
  TimePoint due_{};
  std::vector<double> window_;
  bool running_ = false;
};

struct PipelineView {
  std::int64_t step = 0;
  std::int64_t max_steps = 0;
  std::int64_t inflight = 0;       // rollouts
  std::int64_t queued_groups = 0;  // finished, scored, not yet batched
  std::int64_t scoring_groups = 0;
  double tokens_per_s = 0.0;  // completion tokens per second over the last interval
  double staleness = 0.0;     // (next step - 1) - oldest queued version
  Version version = kNoVersion;
  double last_sync_ms = 0.0;
  LagProbe::Window lag;
};
std::string format_pipeline_view(const PipelineView& v);

class PeriodicLogger {
 public:
  PeriodicLogger(asio::any_io_executor ex, Clock& clock, double interval_s, std::function<void()> tick)
      : ex_(ex),
        clock_(clock),
        interval_(std::chrono::duration_cast<Duration>(std::chrono::duration<double>(interval_s))),
        tick_(std::move(tick)),
        wake_(ex) {}
  Awaitable<void> run();
  void stop();

 private:
  asio::any_io_executor ex_;
  Clock& clock_;
  Duration interval_;
  std::function<void()> tick_;
  Signal wake_;
  bool stopped_ = false;
};

}  // namespace arlo::orch
