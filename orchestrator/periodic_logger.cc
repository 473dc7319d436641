#include "orchestrator/periodic_logger.h"

#include <fmt/format.h>

#include <algorithm>

namespace arlo::orch {

void LagProbe::start() {
  running_ = true;
  arm();
}

void LagProbe::stop() {
  running_ = false;
  timer_.reset();
}

void LagProbe::arm() {
  due_ = clock_.now() + period_;
  timer_ = clock_.schedule(due_, [this] {
    if (!running_) return;
    const auto lag = std::chrono::duration<double>(clock_.now() - due_).count();
    if (window_.size() < 100000) window_.push_back(std::max(0.0, lag));
    arm();
  });
}

LagProbe::Window LagProbe::take() {
  Window w;
  w.samples = window_.size();
  if (!window_.empty()) {
    std::sort(window_.begin(), window_.end());
    auto at = [&](double q) {
      const auto i = static_cast<std::size_t>(q * static_cast<double>(window_.size() - 1) + 0.5);
      return window_[std::min(i, window_.size() - 1)];
    };
    w.p50 = at(0.50);
    w.p99 = at(0.99);
    w.max = window_.back();
  }
  window_.clear();
  return w;
}

std::string format_pipeline_view(const PipelineView& v) {
  return fmt::format(
      "pipeline | step {}/{} | v{} | in flight {} | queued {} (+{} scoring) | {:.0f} tok/s | staleness {:.1f} | "
      "sync {:.0f} ms | loop lag p50 {:.2f} ms p99 {:.2f} ms",
      v.step, v.max_steps, v.version, v.inflight, v.queued_groups, v.scoring_groups, v.tokens_per_s, v.staleness,
      v.last_sync_ms, v.lag.p50 * 1e3, v.lag.p99 * 1e3);
}

Awaitable<void> PeriodicLogger::run() {
  auto next = clock_.now() + interval_;
  while (!stopped_) {
    Promise<bool> woke(ex_);
    auto timer = clock_.schedule(next, [woke]() mutable { woke.set(true); });
    // stop() wakes us early through the signal.
    spawn(ex_, [this, woke]() mutable -> Awaitable<void> {
      co_await wake_.wait();
      woke.set(false);
    });
    const bool due = co_await woke.get();
    wake_.notify();  // release the helper waiter if the timer fired first
    if (!due || stopped_) break;
    tick_();
    next += interval_;
    if (next < clock_.now()) next = clock_.now() + interval_;
  }
}

void PeriodicLogger::stop() {
  stopped_ = true;
  wake_.notify();
}

}  // namespace arlo::orch
