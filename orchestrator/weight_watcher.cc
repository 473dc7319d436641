#include "orchestrator/weight_watcher.h"

#include <fmt/format.h>

#include "common/log.h"

namespace arlo::orch {

namespace {
// How often a worker left out of updates is probed (and the deadline of one probe): its GET of the
// weights it holds is cheap, so a worker that comes back rejoins within seconds.
Duration probe_interval(const Options& o) { return std::min<Duration>(o.admin_timeout, std::chrono::seconds(5)); }
}  // namespace

WeightWatcher::WeightWatcher(asio::any_io_executor ex, ClockPort& clock, InferencePort& inference,
                             RolloutDispatcher& dispatcher, const Options& options,
                             std::function<void(const SyncReport&)> on_synced)
    : ex_(ex),
      clock_(clock),
      inference_(inference),
      dispatcher_(dispatcher),
      opt_(options),
      on_synced_(std::move(on_synced)),
      changed_(ex),
      synced_(options.initial_version) {}

void WeightWatcher::notify(VersionNotice notice) {
  if (latest_ && notice.version <= latest_->version) return;  // duplicate or reordered
  latest_ = std::move(notice);
  changed_.notify();
}

void WeightWatcher::restarted(const std::string& worker) {
  ARLO_INFO("weight sync: worker {} was restarted; syncing the current version to it", worker);
  left_out_.erase(worker);
  out_of_date_.erase(worker);
  attempts_.erase(worker);
  resync_ = true;
  changed_.notify();
}

void WeightWatcher::stop() {
  stopped_ = true;
  changed_.notify();
}

Awaitable<void> WeightWatcher::run() {
  while (!stopped_) {
    const bool newer = latest_ && latest_->version > synced_;
    const bool rejoined = resync_ && latest_ && synced_ != kNoVersion;
    if (!newer && !rejoined) {
      co_await changed_.wait();
      continue;
    }
    resync_ = false;
    auto notice = *latest_;
    co_await sync(std::move(notice));
  }
}

Awaitable<void> WeightWatcher::probe(std::string worker) {
  while (!stopped_) {
    co_await sleep_until(ex_, clock_, clock_.now() + probe_interval(opt_));
    if (stopped_ || !left_out_.count(worker)) break;  // stopped, or rejoined on a restart
    const auto deadline = clock_.now() + probe_interval(opt_);
    auto query = inference_.weights(worker, deadline);
    auto answered = co_await with_deadline<WorkerWeights>(ex_, clock_, deadline, std::move(query), "probing a worker");
    if (!answered) continue;
    ARLO_INFO("weight sync: worker {} answers again (it holds v{}); it rejoins the updates", worker, answered->version);
    left_out_.erase(worker);
    resync_ = true;
    changed_.notify();
    co_return;
  }
}

Awaitable<bool> WeightWatcher::wait_synced(Version v, TimePoint deadline) {
  bool expired = false;
  auto timer = clock_.schedule(deadline, [this, &expired] {
    expired = true;
    changed_.notify();
  });
  while (synced_ < v && !expired && !stopped_) co_await changed_.wait();
  co_return synced_ >= v;
}

Awaitable<Status> WeightWatcher::admin(AdminOp op, std::string worker, Version v) {
  const auto mode = opt_.update_mode;
  const std::string what = op == AdminOp::kPause    ? fmt::format("pause({}) {}", to_string(mode), worker)
                           : op == AdminOp::kUpdate ? fmt::format("update_weights(v{}) {}", v, worker)
                                                    : fmt::format("resume {}", worker);
  auto backoff = opt_.admin_backoff;
  Status last = ok();
  for (int attempt = 1; attempt <= opt_.admin_attempts; ++attempt) {
    const auto deadline = clock_.now() + opt_.admin_timeout;
    auto call = op == AdminOp::kPause    ? inference_.pause(worker, mode, deadline)
                : op == AdminOp::kUpdate ? inference_.update_weights(worker, v, deadline)
                                         : inference_.resume(worker, deadline);
    last = co_await with_deadline<void>(ex_, clock_, deadline, std::move(call), what.c_str());
    if (last) co_return last;
    ARLO_WARN("weight sync: {} failed (attempt {}/{}): {}", what, attempt, opt_.admin_attempts, last.error().what());
    if (attempt < opt_.admin_attempts) {
      const auto wake = clock_.now() + backoff;
      co_await sleep_until(ex_, clock_, wake);
      backoff *= 2;
    }
  }
  co_return last;
}

Awaitable<void> WeightWatcher::sync_worker(Version v, WorkerSync& out) {
  auto phase = [this](TimePoint& t) {
    const auto now = clock_.now();
    const double s = std::chrono::duration<double>(now - t).count();
    t = now;
    return s;
  };
  auto t = out.start = clock_.now();
  auto paused = co_await admin(AdminOp::kPause, out.worker, v);
  out.pause_s = phase(t);
  Status updated = paused;
  if (paused) {
    updated = co_await admin(AdminOp::kUpdate, out.worker, v);
    out.update_s = phase(t);
  }
  // Resume even when the update failed: the worker then serves its previous version, which its
  // tokens report, rather than nothing. A worker that did not answer the pause is not asked (it is
  // left out and probed; its rejoin update resumes it).
  Status resumed = ok();
  if (paused) {
    resumed = co_await admin(AdminOp::kResume, out.worker, v);
    out.resume_s = phase(t);
  }
  if (!updated) {
    out.error = updated.error().what();
  } else if (!resumed) {
    out.error = resumed.error().what();
  }
}

Awaitable<Status> WeightWatcher::drain_dispatcher() {
  co_await dispatcher_.wait_idle();
  co_return ok();
}

Awaitable<void> WeightWatcher::sync(VersionNotice notice) {
  const auto v = notice.version;
  const auto t0 = clock_.now();
  syncing_ = true;
  const bool hold = opt_.update_mode != PauseMode::kKeep;
  if (hold) dispatcher_.hold(true);
  if (opt_.update_mode == PauseMode::kWait) {
    auto drain = drain_dispatcher();
    auto drained = co_await with_deadline<void>(ex_, clock_, t0 + opt_.drain_timeout, std::move(drain),
                                                "drain before weight update");
    if (!drained) ARLO_WARN("weight sync v{}: {}; swapping anyway", v, drained.error().what());
  }

  SyncReport report;
  report.version = v;
  report.start = t0;
  report.trainer_metrics = notice.metrics;
  if (v != attempted_) {  // a new version: every worker may try it
    attempted_ = v;
    attempts_.clear();
    out_of_date_.clear();
  }
  const auto all = inference_.workers();
  for (const auto& w : all) {
    if (left_out_.count(w) || out_of_date_.count(w)) continue;
    report.workers.emplace_back();
    report.workers.back().worker = w;
  }
  if (report.workers.empty() && !all.empty()) {
    if (hold) dispatcher_.hold(false);
    syncing_ = false;
    if (out_of_date_.size() == all.size() && synced_ < v) {
      report.gave_up = fmt::format("no worker took v{} in {} attempts each (see the errors above)", v, opt_.version_attempts);
      ARLO_ERROR("weight sync: {}; stopping", report.gave_up);
      if (on_synced_) on_synced_(report);
    } else {
      ARLO_ERROR("weight sync: v{} waits: every worker is left out after failed updates; probing them", v);
    }
    co_await changed_.wait();  // a probe that succeeds, a newer version or stop
    co_return;
  }
  // All workers in parallel; the update is as slow as the slowest worker, not their sum.
  Promise<bool> all_done(ex_);
  auto remaining = std::make_shared<std::size_t>(report.workers.size());
  for (auto& w : report.workers) {
    spawn(ex_, [this, &w, v, remaining, all_done]() mutable -> Awaitable<void> {
      co_await sync_worker(v, w);
      if (!w.ok()) ARLO_ERROR("weight sync: worker {} did not take v{}: {}", w.worker, v, w.error);
      if (--*remaining == 0) all_done.set(true);
    });
  }
  if (!report.workers.empty()) co_await all_done.get();

  if (hold) dispatcher_.hold(false);
  syncing_ = false;
  for (const auto& w : report.workers) {
    if (w.ok()) continue;
    ++report.workers_failed;
    if (++attempts_[w.worker] >= opt_.version_attempts) {
      out_of_date_.insert(w.worker);
      ARLO_ERROR("weight sync: worker {} failed v{} {} times; it is out of date (serves what it holds) until a newer "
                 "version comes",
                 w.worker, v, attempts_[w.worker]);
      continue;  // not probed for this version: a newer one tries it again
    }
    if (left_out_.insert(w.worker).second) {
      ARLO_WARN("weight sync: worker {} is left out of updates until it answers (probed every {} ms)", w.worker,
                std::chrono::duration_cast<std::chrono::milliseconds>(probe_interval(opt_)).count());
      spawn(ex_, probe(w.worker));
    }
  }
  failures_ += static_cast<std::uint64_t>(report.workers_failed);
  report.seconds = std::chrono::duration<double>(clock_.now() - t0).count();
  report.applied = report.workers.empty() || report.workers_failed < static_cast<int>(report.workers.size());
  if (!report.applied) {
    if (on_synced_) on_synced_(report);
    if (out_of_date_.size() == all.size()) {
      co_return;  // the next round gives up (above), unless a newer version came
    }
    ARLO_ERROR("weight sync: no worker took v{}; retrying after backoff", v);
    co_await sleep_until(ex_, clock_, clock_.now() + opt_.admin_backoff);
    co_return;
  }
  synced_ = v;
  last_seconds_ = report.seconds;
  dispatcher_.on_version(v);
  changed_.notify();
  if (on_synced_) on_synced_(report);
}

}  // namespace arlo::orch
