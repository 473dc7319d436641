#pragma once
// WeightWatcher: reacts to the trainer's "version v published" notification (pushed through the
// TrainerPort, never polled) by driving every worker through pause(mode) -> update_weights(v) ->
// resume, then advancing the version the dispatcher sees. Notifications that arrive during an
// update coalesce: the next update goes straight to the newest version.
//
// Modes: keep  - workers pause, swap and resume; in-flight requests continue and their tokens carry
//                the versions that produced them (no hold on dispatch);
//        wait  - dispatch is held and in-flight requests drain before the swap;
//        abort - dispatch is held, workers abort in-flight requests (which come back with
//                finish_reason "abort" and their partial tokens); after resume the dispatcher
//                continues each aborted sample from its tokens.
// Every admin call has a deadline (admin_timeout) and up to admin_attempts tries with doubling
// backoff; none can hang. A worker that cannot be updated keeps serving its previous version (its
// tokens say so) and is counted in failures(); if no worker took the version, the update is retried.
// A worker that failed an update is left out of the next ones (a version never waits on a dead or
// stopped worker past that one update) and probed (GET its weights) every few seconds; once it
// answers it rejoins, and the current version is synced again so it catches up.
// A worker that answers nothing at all (InferencePort::silent_workers(): its requests already
// failed over) is left out of a round without an admin call, instead of spending its pause
// attempts' deadlines; it is probed like a failed one and rejoins once it answers again and is no
// longer silent. Skipping it is not a failed attempt of the version. A worker that goes silent
// during its admin calls, or whose health probe gets no answer (InferencePort::unreachable_workers()),
// is not retried past the attempt that was cut off.
// Retries are capped: a worker that failed one version `version_attempts` times is out of date
// (it serves what it holds) until a newer version comes, and is not tried again for that one; when
// every worker is out of date for a version none of them took, the run stops with the reason
// (SyncReport::gave_up).
// Each update call gets the round (WeightRound): the version with the announcement it came from,
// who receives it (not left out, paused, not holding it) and whether the worker's update already
// failed once in it: a chain (weight_sync.topology chain) routes each worker around relays that
// are dead, left out or already hold the version. With Options::pause_all_first (chains) every worker pauses before any
// update starts, so a relay that does not answer its pause is out of the round before anyone pulls from it.
//
// Threading: the io_context thread only.
#include <boost/asio/any_io_executor.hpp>

#include <functional>
#include <optional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/async/coro.h"
#include "orchestrator/dispatcher.h"
#include "orchestrator/options.h"
#include "orchestrator/ports.h"

namespace arlo::orch {

// One worker's part of one version update: how long each admin phase took (0 when not reached).
struct WorkerSync {
  std::string worker;
  TimePoint start{};
  double pause_s = 0.0;
  double update_s = 0.0;  // the transfer: the worker fetches and applies the version
  double resume_s = 0.0;
  std::string error;  // empty when the worker took the version
  bool ok() const { return error.empty(); }
};

// One update attempt of one version. `applied` is false when no worker took it (it is retried).
struct SyncReport {
  Version version = 0;
  bool applied = false;
  TimePoint start{};
  double seconds = 0.0;
  int workers_failed = 0;
  std::vector<WorkerSync> workers;
  nlohmann::json trainer_metrics;  // from the notice (loss, grad_norm, ...)
  std::string gave_up;             // set when no worker will take this version: why the run stops
};

class WeightWatcher {
 public:
  WeightWatcher(asio::any_io_executor ex, Clock& clock, InferencePort& inference, RolloutDispatcher& dispatcher,
                const Options& options, std::function<void(const SyncReport&)> on_synced);

  // The TrainerPort's callback.
  void notify(VersionNotice notice);
  // `worker` was restarted (it holds no weights until updated): it rejoins the updates at once, even
  // if it was not left out yet, and the current version is synced again.
  void restarted(const std::string& worker);
  // `worker` died and its supervisor will start it again (arlo run, after its restart delay):
  // until restarted() it counts as coming back, so the end of a run waits for it (bounded) rather
  // than report a worker that failed an update meanwhile as gone. See restart_pending().
  void restarting(const std::string& worker);
  // `worker` answers again after it answered nothing or failed (InferencePort::on_worker_back): it
  // may have been restarted by someone other than arlo (an external server) and serve other weights.
  // Asks what it holds; one that does not hold the version it last took is synced as restarted().
  // Workers left out (their probe rejoins them) or restarting (restarted() follows) are skipped.
  void worker_back(const std::string& worker);
  bool restart_pending(const std::string& worker) const { return restarting_.count(worker) > 0; }
  Awaitable<void> run();
  void stop();

  Version synced() const { return synced_; }
  Version announced() const { return latest_ ? latest_->version : kNoVersion; }
  bool syncing() const { return syncing_; }
  // Workers left out of updates until they answer a probe.
  const std::set<std::string>& left_out() const { return left_out_; }
  // Workers that failed the newest version version_attempts times (not tried again for it).
  const std::set<std::string>& out_of_date() const { return out_of_date_; }
  std::uint64_t failures() const { return failures_; }
  double last_sync_seconds() const { return last_seconds_; }
  // Completes once `v` (or newer) is synced, or at `deadline` (returns false then), or on stop().
  Awaitable<bool> wait_synced(Version v, TimePoint deadline);

 private:
  // One round for `notice`'s version: hold_dispatch, choose_round_workers, update_round_workers,
  // end_hold, count_failed_workers; then the version is synced, or retried after admin_backoff.
  Awaitable<void> sync(VersionNotice notice);
  // Holds new rollouts for the round (wait and abort modes); wait mode then drains the dispatcher
  // until t0 + drain_timeout, and swaps anyway past it.
  Awaitable<void> hold_dispatch(Version v, TimePoint t0, bool hold);
  // Ends the round's hold and marks the sync over.
  void end_hold(bool hold);
  // The round's workers into report.workers: every one of `all` not left out or out of date.
  // Silent ones not heard since a restart are noted in round_silent_ (asked nothing, not counted).
  Awaitable<void> choose_round_workers(const std::vector<std::string>& all, SyncReport& report);
  // No worker can take part: gives up (a report with gave_up) once all `workers` are out of date
  // for a version newer than the synced one; else waits for a probe to succeed. Either way returns
  // on the next change (a probe that succeeds, a newer version or stop).
  Awaitable<void> wait_for_a_taker(Version v, std::size_t workers, SyncReport& report);
  // Pauses and updates every round worker at once (pause_all_first: all pauses first); records the
  // version each one took.
  Awaitable<void> update_round_workers(Version v, SyncReport& report);
  // Each worker that failed: an attempt of v counted (not for a silent one), out of date after
  // version_attempts, else left out and probed. Counts them in report.workers_failed and failures_.
  void count_failed_workers(Version v, SyncReport& report);
  Awaitable<Status> drain_dispatcher();
  // One worker's phases of a round; `paused` says whether its pause succeeded.
  Awaitable<void> pause_worker(Version v, WorkerSync& out, char& paused);
  Awaitable<void> update_worker(Version v, WorkerSync& out, bool paused);
  Awaitable<void> pause_and_update(Version v, WorkerSync& out, char& paused);
  // Runs body(i) for i in [0, n) at once; returns when every one ended.
  Awaitable<void> each_worker(std::size_t n, std::function<Awaitable<void>(std::size_t)> body);
  enum class AdminOp { kPause, kUpdate, kResume };
  Awaitable<Status> admin(AdminOp op, std::string worker, Version v);
  // Whether the worker of a failed admin call answers nothing: its last health probe got no answer,
  // or the call ran out its deadline and a weights query gets no answer within a probe interval
  // either (the probe may not have timed out yet). Such a worker is not asked again this round.
  Awaitable<bool> answers_nothing(const std::string& worker, const Status& failure);
  Awaitable<void> probe(std::string worker);
  bool back_is_news(const std::string& worker) const;
  Awaitable<void> check_back(std::string worker);

  asio::any_io_executor ex_;
  Clock& clock_;
  InferencePort& inference_;
  RolloutDispatcher& dispatcher_;
  const Options& opt_;
  std::function<void(const SyncReport&)> on_synced_;
  Signal changed_;

  std::optional<VersionNotice> latest_;
  Version synced_;
  bool syncing_ = false;
  bool stopped_ = false;
  std::set<std::string> left_out_;
  Version attempted_ = kNoVersion;       // the version attempts_ counts for
  std::map<std::string, int> attempts_;  // failed attempts of attempted_, per worker
  std::set<std::string> out_of_date_;
  bool resync_ = false;                        // a worker rejoined: sync the current version again
  std::map<std::string, Version> held_;        // the newest version each worker took
  nlohmann::json round_weight_sync_;           // the announcement of the round's version
  std::set<std::string> round_receivers_;      // WeightRound::receivers
  std::set<std::string> round_retried_;        // WeightRound::retry
  std::set<std::string> round_unanswering_;    // asked this round and answered nothing: asked no more
  std::set<std::string> round_silent_;         // left out of this round unasked: they answer nothing
  std::set<std::string> restarting_;           // see restarting()
  std::set<std::string> restarted_mid_round_;  // restarted() while a round ran: its failure there is not counted
  // Restarted since the last round: their supervisor heard them answer, so the pool's silence
  // verdict (from before the restart) does not leave them out of the next round.
  std::set<std::string> heard_;
  std::uint64_t failures_ = 0;
  double last_seconds_ = 0.0;
};

}  // namespace arlo::orch
