#include "orchestrator/weight_watcher.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/log.h"

namespace arlo::orch {

namespace {
// How often a worker left out of updates is probed (and the deadline of one probe): its GET of the
// weights it holds is cheap, so a worker that comes back rejoins within seconds.
Duration probe_interval(const Options& o) { return std::min<Duration>(o.admin_timeout, std::chrono::seconds(5)); }
}  // namespace

WeightWatcher::WeightWatcher(asio::any_io_executor ex, Clock& clock, InferencePort& inference,
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
  held_.erase(worker);  // it holds nothing now
  restarting_.erase(worker);
  heard_.insert(worker);
  if (syncing_) restarted_mid_round_.insert(worker);  // the round's failure on it was the dead process's
  resync_ = true;
  changed_.notify();
}

void WeightWatcher::restarting(const std::string& worker) {
  restarting_.insert(worker);
  changed_.notify();
}

void WeightWatcher::worker_back(const std::string& worker) {
  if (!back_is_news(worker)) return;
  spawn(ex_, check_back(worker));
}

// A worker answering again is for check_back only while no other path owns it: the probe of a left-out
// worker and the supervisor's restart resync it themselves.
bool WeightWatcher::back_is_news(const std::string& worker) const {
  return !stopped_ && !left_out_.count(worker) && !restarting_.count(worker);
}

Awaitable<void> WeightWatcher::check_back(std::string worker) {
  while (syncing_ && !stopped_) co_await changed_.wait();  // what it holds is in flux until the round ends
  const auto took = held_.count(worker) ? held_.at(worker) : opt_.initial_version;
  const auto deadline = clock_.now() + opt_.admin_timeout;
  auto query = inference_.weights(worker, deadline);
  auto holds = co_await with_deadline<WorkerWeights>(ex_, clock_, deadline, std::move(query), "asking a worker");
  if (!back_is_news(worker)) co_return;
  if (holds && holds->version == took) co_return;
  ARLO_INFO("weight sync: worker {} answers again and {}, not v{} it took: it was restarted", worker,
            holds ? (holds->version == kNoVersion ? std::string("holds no arlo version")
                                                  : fmt::format("holds v{}", holds->version))
                  : "does not say what it holds (" + holds.error().what() + ")",
            took);
  restarted(worker);
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
    // Its pool circuit is still open (the pool has not heard from it): a round would skip it again.
    auto silent = co_await inference_.silent_workers();
    if (stopped_ || !left_out_.count(worker)) break;
    if (std::find(silent.begin(), silent.end(), worker) != silent.end()) continue;
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
  if (round_unanswering_.count(worker))
    co_return make_error(ErrorCode::kUnavailable,
                         fmt::format("{}: not asked, it answered nothing earlier in this round", what));
  auto backoff = opt_.admin_backoff;
  Status last = ok();
  for (int attempt = 1; attempt <= opt_.admin_attempts; ++attempt) {
    const auto deadline = clock_.now() + opt_.admin_timeout;
    auto call =
        op == AdminOp::kPause ? inference_.pause(worker, mode, deadline)
        : op == AdminOp::kUpdate
            ? inference_.update_weights(
                  worker, WeightRound{v, round_weight_sync_, round_receivers_, round_retried_.count(worker) > 0},
                  deadline)
            : inference_.resume(worker, deadline);
    last = co_await with_deadline<void>(ex_, clock_, deadline, std::move(call), what.c_str());
    if (last) co_return last;
    if (op == AdminOp::kUpdate) round_retried_.insert(worker);  // its next attempt avoids a relay that failed it
    ARLO_WARN("weight sync: {} failed (attempt {}/{}): {}", what, attempt, opt_.admin_attempts, last.error().what());
    if (attempt < opt_.admin_attempts) {
      // A dark link or a hung host: another try would only wait out its deadline.
      if (co_await answers_nothing(worker, last)) {
        ARLO_WARN("weight sync: {}: not retried, the worker answers nothing (nor its health probe)", what);
        round_unanswering_.insert(worker);
        break;
      }
      const auto wake = clock_.now() + backoff;
      co_await sleep_until(ex_, clock_, wake);
      backoff *= 2;
    }
  }
  co_return last;
}

Awaitable<bool> WeightWatcher::answers_nothing(const std::string& worker, const Status& failure) {
  auto unreachable = co_await inference_.unreachable_workers();
  if (std::find(unreachable.begin(), unreachable.end(), worker) != unreachable.end()) co_return true;
  if (failure.error().code() != ErrorCode::kTimeout) co_return false;  // it answered, with an error
  const auto deadline = clock_.now() + probe_interval(opt_);
  auto query = inference_.weights(worker, deadline);
  auto held = co_await with_deadline<WorkerWeights>(ex_, clock_, deadline, std::move(query), "asking a worker");
  co_return !held && held.error().code() == ErrorCode::kTimeout;
}

namespace {
double lap(Clock& clock, TimePoint& t) {
  const auto now = clock.now();
  const double s = std::chrono::duration<double>(now - t).count();
  t = now;
  return s;
}
}  // namespace

Awaitable<void> WeightWatcher::pause_worker(Version v, WorkerSync& out, char& paused) {
  auto t = out.start = clock_.now();
  if (round_silent_.count(out.worker)) {  // nothing to ask: its calls would only wait out their deadlines
    out.error = "left out unasked: it answers nothing (its inference requests failed over to other workers)";
    paused = 0;
    round_receivers_.erase(out.worker);
    co_return;
  }
  auto st = co_await admin(AdminOp::kPause, out.worker, v);
  out.pause_s = lap(clock_, t);
  paused = st ? 1 : 0;
  if (!st) {
    out.error = st.error().what();
    round_receivers_.erase(out.worker);  // nobody pulls from it in this round
    co_return;
  }
  if (!opt_.pause_all_first) co_return;
  // A chain asks what it holds: a worker that already has v (a retry brought it a newer one, or it
  // was resynced) does not receive it, so no relay waits for it. Unanswered: it is assumed to receive.
  const auto deadline = clock_.now() + probe_interval(opt_);
  auto query = inference_.weights(out.worker, deadline);
  auto held =
      co_await with_deadline<WorkerWeights>(ex_, clock_, deadline, std::move(query), "reading a worker's weights");
  if (held && held->version >= v)
    round_receivers_.erase(out.worker);
  else if (held)
    round_receivers_.insert(out.worker);
}

Awaitable<void> WeightWatcher::pause_and_update(Version v, WorkerSync& out, char& paused) {
  co_await pause_worker(v, out, paused);
  co_await update_worker(v, out, paused != 0);
}

Awaitable<void> WeightWatcher::each_worker(std::size_t n, std::function<Awaitable<void>(std::size_t)> body) {
  if (n == 0) co_return;
  Promise<bool> done(ex_);
  auto remaining = std::make_shared<std::size_t>(n);
  for (std::size_t i = 0; i < n; ++i)
    spawn(ex_, [&body, i, remaining, done]() mutable -> Awaitable<void> {
      co_await body(i);
      if (--*remaining == 0) done.set(true);
    });
  co_await done.get();
}

Awaitable<void> WeightWatcher::update_worker(Version v, WorkerSync& out, bool paused) {
  auto t = clock_.now();
  Status updated = ok();
  if (paused) {
    updated = co_await admin(AdminOp::kUpdate, out.worker, v);
    out.update_s = lap(clock_, t);
  }
  // Resume even when the update failed: the worker then serves its previous version, which its
  // tokens report, rather than nothing. A worker that did not answer the pause is not asked (it is
  // left out and probed; its rejoin update resumes it).
  Status resumed = ok();
  if (paused) {
    resumed = co_await admin(AdminOp::kResume, out.worker, v);
    out.resume_s = lap(clock_, t);
  }
  if (!paused) co_return;  // its pause error is the report's
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
  restarted_mid_round_.clear();
  const bool hold = opt_.update_mode != PauseMode::kKeep;
  co_await hold_dispatch(v, t0, hold);

  SyncReport report;
  report.version = v;
  report.start = t0;
  report.trainer_metrics = notice.metrics;
  round_weight_sync_ = notice.weight_sync;
  if (v != attempted_) {  // a new version: every worker may try it
    attempted_ = v;
    attempts_.clear();
    out_of_date_.clear();
  }
  const auto all = inference_.workers();
  co_await choose_round_workers(all, report);
  if (report.workers.empty() && !all.empty()) {
    end_hold(hold);
    co_await wait_for_a_taker(v, all.size(), report);
    co_return;
  }
  co_await update_round_workers(v, report);
  end_hold(hold);
  count_failed_workers(v, report);
  report.seconds = std::chrono::duration<double>(clock_.now() - t0).count();
  report.applied = report.workers.empty() || report.workers_failed < static_cast<int>(report.workers.size());
  if (!report.applied) {
    if (on_synced_) on_synced_(report);
    if (out_of_date_.size() == all.size()) {
      co_return;  // the next round gives up (wait_for_a_taker), unless a newer version came
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

Awaitable<void> WeightWatcher::hold_dispatch(Version v, TimePoint t0, bool hold) {
  if (hold) dispatcher_.hold(true);
  if (opt_.update_mode == PauseMode::kWait) {
    auto drain = drain_dispatcher();
    auto drained = co_await with_deadline<void>(ex_, clock_, t0 + opt_.drain_timeout, std::move(drain),
                                                "drain before weight update");
    if (!drained) ARLO_WARN("weight sync v{}: {}; swapping anyway", v, drained.error().what());
  }
}

void WeightWatcher::end_hold(bool hold) {
  if (hold) dispatcher_.hold(false);
  syncing_ = false;
  changed_.notify();  // check_back waits for the round to end
}

Awaitable<void> WeightWatcher::choose_round_workers(const std::vector<std::string>& all, SyncReport& report) {
  round_silent_.clear();
  for (auto& w : co_await inference_.silent_workers())
    if (!left_out_.count(w) && !out_of_date_.count(w) && !heard_.count(w)) round_silent_.insert(std::move(w));
  heard_.clear();
  for (const auto& w : all) {
    if (left_out_.count(w) || out_of_date_.count(w)) continue;
    report.workers.emplace_back();
    report.workers.back().worker = w;
  }
}

Awaitable<void> WeightWatcher::wait_for_a_taker(Version v, std::size_t workers, SyncReport& report) {
  if (out_of_date_.size() == workers && synced_ < v) {
    report.gave_up =
        fmt::format("no worker took v{} in {} attempts each (see the errors above)", v, opt_.version_attempts);
    ARLO_ERROR("weight sync: {}; stopping", report.gave_up);
    if (on_synced_) on_synced_(report);
  } else {
    ARLO_ERROR("weight sync: v{} waits: every worker is left out after failed updates; probing them", v);
  }
  co_await changed_.wait();  // a probe that succeeds, a newer version or stop
}

Awaitable<void> WeightWatcher::update_round_workers(Version v, SyncReport& report) {
  // All workers in parallel; the update is as slow as the slowest worker, not their sum.
  round_receivers_.clear();
  round_retried_.clear();
  round_unanswering_.clear();
  for (const auto& w : report.workers) {
    const auto held = held_.find(w.worker);
    if (held == held_.end() || held->second < v) round_receivers_.insert(w.worker);
  }
  std::vector<char> paused(report.workers.size(), 0);
  if (opt_.pause_all_first) {  // every worker pauses before any update starts
    co_await each_worker(report.workers.size(), [this, &report, &paused, v](std::size_t i) {
      return pause_worker(v, report.workers[i], paused[i]);
    });
    co_await each_worker(report.workers.size(), [this, &report, &paused, v](std::size_t i) {
      return update_worker(v, report.workers[i], paused[i] != 0);
    });
  } else {
    co_await each_worker(report.workers.size(), [this, &report, &paused, v](std::size_t i) {
      return pause_and_update(v, report.workers[i], paused[i]);
    });
  }
  for (const auto& w : report.workers)
    if (!w.ok()) ARLO_ERROR("weight sync: worker {} did not take v{}: {}", w.worker, v, w.error);
  round_receivers_.clear();
  round_retried_.clear();
  for (const auto& w : report.workers)
    if (w.ok()) held_[w.worker] = std::max(held_[w.worker], v);
}

void WeightWatcher::count_failed_workers(Version v, SyncReport& report) {
  for (const auto& w : report.workers) {
    if (w.ok()) continue;
    ++report.workers_failed;
    // Restarted while this round ran: the calls that failed went to the process that died, and
    // restarted() asked for its resync; leaving it out now would undo that.
    if (restarted_mid_round_.count(w.worker)) continue;
    // A silent worker was not tried: no attempt of this version is counted against it.
    if (!round_silent_.count(w.worker) && ++attempts_[w.worker] >= opt_.version_attempts) {
      out_of_date_.insert(w.worker);
      ARLO_ERROR(
          "weight sync: worker {} failed v{} {} times; it is out of date (serves what it holds) until a newer "
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
  restarted_mid_round_.clear();
  failures_ += static_cast<std::uint64_t>(report.workers_failed);
}

}  // namespace arlo::orch
