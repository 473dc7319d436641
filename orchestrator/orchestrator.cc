#include "orchestrator/orchestrator.h"

#include <boost/asio/post.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "common/log.h"
#include "orchestrator/checkpoint.h"

namespace arlo::orch {

namespace {
double seconds(Duration d) { return std::chrono::duration<double>(d).count(); }
}  // namespace

Orchestrator::Orchestrator(boost::asio::io_context& io, Ports ports, Options options, RunObserver* observer)
    : io_(io),
      ports_(std::move(ports)),
      opt_(std::move(options)),
      observer_(observer ? observer : &silent_),
      finished_signal_(io.get_executor()) {
  auto ex = io_.get_executor();
  auto& clock = *ports_.clock;
  DispatcherHooks dh;
  dh.on_train_group = [this](GroupPtr g) { train_sink_->add(std::move(g)); };
  dh.on_eval_group = [this](GroupPtr g) { eval_sink_->add(std::move(g)); };
  dh.on_eval_group_lost = [this](GroupPtr g) { eval_sink_->lost(std::move(g)); };
  dh.backlog_groups = [this] { return train_sink_->backlog_groups(); };
  dh.on_fatal = [this](Error e) { on_fatal(std::move(e)); };
  dispatcher_ = std::make_unique<RolloutDispatcher>(ex, clock, *ports_.inference, *ports_.tasks, ledger_, opt_,
                                                    std::move(dh), ports_.environment);

  // Checkpointing on: every batch is journaled, with the checkpoint of its cut, before it leaves
  // (orchestrator/checkpoint.h, docs/checkpoints.md).
  if (!opt_.run_dir.empty() && opt_.ckpt_interval > 0)
    journal_ = std::make_unique<JournalingTrainer>(*ports_.trainer, opt_.run_dir,
                                                   [this](std::int64_t step) { return checkpoint_state(step); });
  TrainSinkHooks th;
  th.on_cut = [this](std::int64_t s) { dispatcher_->on_step_cut(s); };
  th.on_step = [this](const StepReport& r) { on_step(r); };
  th.on_scored = [this](const Group& g) { observer_->on_scored(g); };
  th.backlog_changed = [this] { dispatcher_->pump(); };
  th.on_fatal = [this](Error e) { on_fatal(std::move(e)); };
  train_sink_ = std::make_unique<TrainSink>(ex, clock, *ports_.scorer, journal_ ? *journal_ : *ports_.trainer,
                                            *ports_.tasks, ledger_, opt_, std::move(th));
  eval_sink_ = std::make_unique<EvalSink>(
      ex, clock, *ports_.scorer, ledger_, opt_, std::move(ports_.eval_tasks),
      [this](std::uint64_t id, const std::vector<std::shared_ptr<const Task>>& tasks, int n) {
        dispatcher_->enqueue_eval(id, tasks, n);
      },
      [this](const EvalReport& r) { observer_->on_eval(r); });
  watcher_ = std::make_unique<WeightWatcher>(ex, clock, *ports_.inference, *dispatcher_, opt_,
                                             [this](const SyncReport& r) { on_synced(r); });
  logger_ = std::make_unique<PeriodicLogger>(ex, clock, opt_.log_interval_s, [this] { tick(); });
  lag_ = std::make_unique<LagProbe>(clock, std::chrono::milliseconds(20));
}

Orchestrator::~Orchestrator() {
  if (ports_.inference) ports_.inference->on_worker_back(nullptr);  // the port may outlive the loop
}

Status Orchestrator::start() {
  if (started_) return make_error(ErrorCode::kInternal, "orchestrator started twice");
  started_ = true;
  ARLO_TRY(opt_.validate());
  run_start_ = ports_.clock->now();
  last_step_at_ = last_tick_at_ = run_start_;

  std::int64_t start_step = 0;
  if (opt_.resume) ARLO_TRY(restore(start_step));

  if (!opt_.run_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(opt_.run_dir, ec);
    if (ec) return make_error(ErrorCode::kIo, fmt::format("creating run dir {}: {}", opt_.run_dir, ec.message()));
  }

  ports_.trainer->on_version([this](VersionNotice n) {
    if (n.version >= summary_.trainer.value("version", Version{-1}))
      summary_.trainer = {{"version", n.version},
                          {"checksum", n.weight_sync.value("checksum", std::string())},
                          {"weight_sync", n.weight_sync}};
    // Version v is published after the trainer acknowledged step v, which it does only once it
    // no longer needs that batch: the journal lets go of steps <= v.
    if (journal_) prune_journal(journal_dir(opt_.run_dir), n.version);
    watcher_->notify(std::move(n));
  });
  ports_.inference->on_worker_back([this](std::string worker) {
    asio::post(io_, [this, worker = std::move(worker)] { watcher_->worker_back(worker); });
  });
  ports_.trainer->on_alive([this] {
    trainer_heard_at_ = ports_.clock->now();
    if (trainer_heard_) return;
    trainer_heard_ = true;  // from its first sign of life on, its silence is timed
    if (opt_.trainer_silence_timeout > Duration::zero() || opt_.trainer_alarm > Duration::zero())
      spawn(io_.get_executor(), watch_trainer());
  });
  spawn(io_.get_executor(), watcher_->run());
  spawn(io_.get_executor(), logger_->run());
  lag_->start();
  spawn(io_.get_executor(), main_loop(start_step));
  observer_->on_start({start_step, dispatcher_->version(), ports_.inference->workers(), ledger_.failed_total(),
                       ledger_.cancelled_total()});
  ARLO_INFO(
      "orchestrator: steps {}..{} (warm-up {}), batch {} = {} groups x {}, max in flight {}, async level {}, "
      "off-policy bound {}, update mode {}",
      start_step + 1, opt_.max_steps, opt_.sft_warmup_steps, opt_.batch_size, opt_.groups_per_step(), opt_.group_size,
      opt_.max_inflight, opt_.max_async_level, opt_.max_off_policy_steps, to_string(opt_.update_mode));
  // The policy RL starts from may already be on the workers.
  if (opt_.eval_at_start && !opt_.resume && dispatcher_->version() >= opt_.sft_warmup_steps) {
    start_eval_done_ = true;
    last_eval_version_ = dispatcher_->version();
    eval_sink_->start(dispatcher_->version());
  }
  dispatcher_->pump();
  return ok();
}

Awaitable<void> Orchestrator::main_loop(std::int64_t start_step) {
  if (auto st = co_await resend_journal(); !st) on_fatal(std::move(st).error());
  if (!fatal_) co_await train_sink_->run(start_step);
  dispatcher_->start_draining();
  dispatcher_->cancel_train("drain");
  const bool reached_end = train_sink_->steps_cut() >= opt_.max_steps && !fatal_ && !stop_requested_;
  if (reached_end) {
    // The final eval must see the final policy: wait for the trainer to publish it and the
    // workers to take it (bounded).
    const bool synced = co_await watcher_->wait_synced(opt_.max_steps, ports_.clock->now() + opt_.final_sync_timeout);
    if (!synced) ARLO_WARN("final version v{} was not synced within the final_sync_timeout", opt_.max_steps);
    co_await eval_sink_->wait_done();
  }
  co_await read_worker_weights();
  finish();
}

Awaitable<void> Orchestrator::read_worker_weights() {
  // A worker that does not hold the synced version yet may be between a restart (its supervisor
  // brought it back just now, or is about to: WeightWatcher::restart_pending) and the resync the
  // WeightWatcher gives it: it is read again, for a bounded while, until it holds what was synced.
  // A worker that answers is given the whole final_sync_timeout to take it (a loaded machine can be
  // slow to apply the last update); one whose restart is pending at most 20 s of it.
  const auto now = ports_.clock->now();
  const auto until = now + opt_.final_sync_timeout;
  const auto restart_until = now + std::min<Duration>(opt_.final_sync_timeout, std::chrono::seconds(20));
  for (const auto& worker : ports_.inference->workers()) {
    nlohmann::json read;
    for (;;) {
      if (watcher_->left_out().count(worker)) {
        // Left out after a failed update. Its supervisor is bringing it back (killed as the run
        // ended: the last rounds failed it before it listened again): wait for the restart and the
        // resync it triggers. Otherwise it answers no probe: do not wait for it again.
        if (!watcher_->restart_pending(worker) || ports_.clock->now() >= restart_until) {
          read = {{"error", watcher_->restart_pending(worker)
                                ? "left out of weight updates: it stopped answering, and its restart did not "
                                  "come back in time"
                                : "left out of weight updates: it stopped answering"}};
          break;
        }
        co_await sleep_until(io_.get_executor(), *ports_.clock, ports_.clock->now() + std::chrono::milliseconds(200));
        continue;
      }
      const auto deadline = ports_.clock->now() + opt_.admin_timeout;
      auto query = ports_.inference->weights(worker, deadline);
      auto w = co_await with_deadline<WorkerWeights>(io_.get_executor(), *ports_.clock, deadline, std::move(query),
                                                     "reading a worker's weights");
      read = w ? nlohmann::json{{"version", w->version}, {"checksum", w->checksum}}
               : nlohmann::json{{"error", w.error().what()}};
      if ((w && w->version >= watcher_->synced()) || ports_.clock->now() >= until) break;
      co_await sleep_until(io_.get_executor(), *ports_.clock, ports_.clock->now() + std::chrono::milliseconds(200));
    }
    summary_.workers[worker] = std::move(read);
  }
}

// A trainer that is no longer heard from (its host unreachable, its process stopped or gone) is
// waited for trainer_silence_timeout, with a warning every trainer_alarm; then the run stops with
// the reason. With no timeout it is waited for as long as it takes: it reconnects and the bridge
// sends it again what it had not acknowledged. Wakes once per deadline, not per heartbeat.
Awaitable<void> Orchestrator::watch_trainer() {
  const auto timeout = opt_.trainer_silence_timeout, alarm = opt_.trainer_alarm;
  TimePoint silence_since = trainer_heard_at_;  // the silence the warnings count in
  std::int64_t warnings = 0;
  while (!finished_ && !fatal_ && !stop_requested_) {
    const auto now = ports_.clock->now();
    if (trainer_heard_at_ != silence_since) {  // heard from since: a new silence starts
      silence_since = trainer_heard_at_;
      warnings = 0;
    }
    const auto silent = now - trainer_heard_at_;
    if (timeout > Duration::zero() && silent >= timeout) {
      on_fatal(Error(ErrorCode::kUnavailable,
                     fmt::format("the trainer has not been heard from for {:.1f} s (no heartbeat or version over the "
                                 "bridge: its host is unreachable, or it is stopped or gone): past "
                                 "trainer.silence_timeout_s ({:g} s) the run stops; trainer.silence_timeout_s: 0 "
                                 "waits for it instead",
                                 seconds(silent), seconds(timeout))));
      co_return;
    }
    TimePoint wake = timeout > Duration::zero() ? trainer_heard_at_ + timeout : TimePoint::max();
    if (alarm > Duration::zero()) {
      if (silent >= alarm * (warnings + 1)) {
        ++warnings;
        ++trainer_silence_alarms_;
        ARLO_WARN(
            "orchestrator: the trainer has not been heard from for {:.0f} s (its host unreachable, or it is "
            "stopped); {}",
            seconds(silent),
            timeout > Duration::zero()
                ? fmt::format("the run stops after trainer.silence_timeout_s ({:g} s)", seconds(timeout))
                : std::string("waiting for it (trainer.silence_timeout_s: 0)"));
      }
      wake = std::min(wake, trainer_heard_at_ + alarm * (warnings + 1));
    }
    co_await sleep_until(io_.get_executor(), *ports_.clock, wake);
  }
}

void Orchestrator::request_stop(const std::string& reason) {
  if (stop_requested_ || finished_) return;
  ARLO_WARN("orchestrator: stopping: {}", reason);
  stop_requested_ = true;
  // Checkpoint now, while the unbatched tasks are still known, so a resume loses no data position.
  if (opt_.ckpt_interval > 0 && train_sink_->steps_cut() > 0) {
    if (auto st = save_checkpoint(train_sink_->steps_cut()); !st)
      ARLO_ERROR("checkpoint on stop: {}", st.error().what());
  }
  train_sink_->stop();
  eval_sink_->stop();
}

void Orchestrator::on_fatal(Error e) {
  if (fatal_) return;
  ARLO_ERROR("orchestrator: fatal: {}", e.what());
  fatal_ = std::move(e);
  train_sink_->abandon(*fatal_);
  eval_sink_->stop();
}

void Orchestrator::on_step(const StepReport& r) {
  const auto now = ports_.clock->now();
  const auto tokens = dispatcher_->completion_tokens_total();
  const double wait_s = dispatcher_->wait_for_policy_seconds();
  StepObservation o;
  o.report = r;
  o.step_seconds = seconds(now - last_step_at_);
  o.tokens_per_s = o.step_seconds > 0 ? static_cast<double>(tokens - tokens_at_last_step_) / o.step_seconds : 0.0;
  o.wait_for_policy_seconds = wait_s - wait_at_last_step_;
  o.last_sync_seconds = last_sync_seconds_;
  o.completed = ledger_.completed_total();
  o.failed = ledger_.failed_total();
  o.cancelled = ledger_.cancelled_total();
  o.model_turns = dispatcher_->model_turns_total();
  o.trajectories = dispatcher_->trajectories_total();
  o.env_failed = dispatcher_->env_failed_total();
  o.ended_because = dispatcher_->ended_because_total();
  o.ledger = ledger_.to_json();
  last_step_at_ = now;
  tokens_at_last_step_ = tokens;
  wait_at_last_step_ = wait_s;
  steps_.push_back(r);
  observer_->on_step(o);
}

void Orchestrator::on_synced(const SyncReport& r) {
  if (!r.gave_up.empty()) {
    on_fatal(Error(ErrorCode::kUnavailable, "weight sync: " + r.gave_up));
    return;
  }
  observer_->on_sync({r, train_sink_->steps_cut(), ports_.clock->now()});
  if (!r.applied) return;
  last_sync_seconds_ = r.seconds;
  const auto v = r.version;
  if (finished_ || fatal_ || stop_requested_ || v <= last_eval_version_) return;
  const bool at_start = opt_.eval_at_start && !start_eval_done_ && !opt_.resume && v >= opt_.sft_warmup_steps;
  const bool at_interval = opt_.eval_interval > 0 && v > opt_.sft_warmup_steps && v % opt_.eval_interval == 0;
  const bool at_end = opt_.eval_at_end && v == opt_.max_steps;
  if (at_start) start_eval_done_ = true;
  if (at_start || at_interval || at_end) {
    last_eval_version_ = v;
    eval_sink_->start(v);
  }
}

void Orchestrator::tick() {
  const auto now = ports_.clock->now();
  const double dt = seconds(now - last_tick_at_);
  const auto tokens = dispatcher_->completion_tokens_total();
  PipelineView v;
  v.step = train_sink_->steps_cut();
  v.max_steps = opt_.max_steps;
  v.inflight = dispatcher_->inflight_samples();
  v.queued_groups = train_sink_->queued_groups();
  v.scoring_groups = train_sink_->scoring_groups();
  v.tokens_per_s = dt > 0 ? static_cast<double>(tokens - tokens_at_last_tick_) / dt : 0.0;
  const auto oldest = train_sink_->oldest_queued_version();
  v.staleness = oldest == kNoVersion ? 0.0 : static_cast<double>(v.step - oldest);
  v.version = dispatcher_->version();
  v.last_sync_ms = last_sync_seconds_ * 1e3;
  v.lag = lag_->take();
  last_tick_at_ = now;
  tokens_at_last_tick_ = tokens;
  observer_->on_pipeline(v);
}

void Orchestrator::finish() {
  dispatcher_->cancel_all("shutdown");
  train_sink_->stop();
  eval_sink_->stop();
  watcher_->stop();
  logger_->stop();
  lag_->stop();
  summarize();
  finished_ = true;
  observer_->on_end({summary_, ledger_.dispatched_total(), ledger_.completed_total(), ledger_.failed_total(),
                     ledger_.cancelled_total()});
  finished_signal_.notify();
}

void Orchestrator::summarize() {
  summary_.steps = train_sink_->steps_cut();
  summary_.seconds = seconds(ports_.clock->now() - run_start_);
  summary_.run_dir = opt_.run_dir;
  std::vector<double> rl;
  for (const auto& s : steps_)
    if (!s.supervised) rl.push_back(s.reward_mean);
  auto mean = [](auto b, auto e) {
    double sum = 0;
    int n = 0;
    for (auto it = b; it != e; ++it, ++n) sum += *it;
    return n ? sum / n : 0.0;
  };
  const auto k = std::min<std::size_t>(5, rl.size());
  summary_.reward_first5 = mean(rl.begin(), rl.begin() + static_cast<long>(k));
  summary_.reward_last5 = mean(rl.end() - static_cast<long>(k), rl.end());
  const auto& evals = eval_sink_->reports();
  if (!evals.empty()) {
    summary_.eval_first = evals.front();
    summary_.eval_last = evals.back();
  }
  summary_.ledger = ledger_.to_json();
  if (fatal_) {
    summary_.ok = false;
    summary_.error = fatal_->what();
  } else if (auto st = ledger_.check(); !st) {
    summary_.ok = false;
    summary_.error = st.error().what();
  } else if (stop_requested_) {
    summary_.error = "stopped on request";
  }
}

Awaitable<RunSummary> Orchestrator::wait() {
  while (!finished_) co_await finished_signal_.wait();
  co_return summary_;
}

}  // namespace arlo::orch
