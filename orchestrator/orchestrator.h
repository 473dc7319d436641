#pragma once
// Orchestrator: owns the five components on one io_context, the rollout ledger and the checkpoint.
// What it reports (steps, weight syncs, evals, the pipeline view, the end) goes to its RunObserver
// (orchestrator/observer.h; session/reporter.h writes the run's files, console lines and status
// page from it). It does not own the ports nor the observer; the caller builds them (real adapters
// in `arlo run`, fakes in tests) and keeps them alive until the orchestrator is destroyed.
//
// Lifecycle: start() (loads a checkpoint when options.resume), then run the io_context; the run
// ends after the batch for max_steps was accepted, the final version synced and the final eval
// reported (or on request_stop() / a fatal error); finished() turns true, summary() holds the
// summary and the observer hears on_end. Drain: in-flight train rollouts are cancelled ("drain"),
// queued groups are disposed of ("unused_at_drain"); the ledger must add up at the end, which the
// summary reports.
//
// Threading: construct, start and query on the io_context's thread.
#include <boost/asio/io_context.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "orchestrator/checkpoint.h"
#include "orchestrator/dispatcher.h"
#include "orchestrator/eval_sink.h"
#include "orchestrator/ledger.h"
#include "orchestrator/observer.h"
#include "orchestrator/options.h"
#include "orchestrator/periodic_logger.h"
#include "orchestrator/ports.h"
#include "orchestrator/train_sink.h"
#include "orchestrator/weight_watcher.h"

namespace arlo::orch {

struct Ports {
  InferencePort* inference = nullptr;
  TaskSource* tasks = nullptr;
  ScorerPort* scorer = nullptr;
  TrainerPort* trainer = nullptr;
  Clock* clock = nullptr;
  EnvironmentPort* environment = nullptr;  // multi-turn environments; nullptr: every task is single-turn
  std::vector<Task> eval_tasks;            // the eval set (may be empty: no eval)
};

class Orchestrator {
 public:
  Orchestrator(boost::asio::io_context& io, Ports ports, Options options, RunObserver* observer = nullptr);
  ~Orchestrator();
  Orchestrator(const Orchestrator&) = delete;
  Orchestrator& operator=(const Orchestrator&) = delete;

  Status start();
  // Graceful stop: no new batches, drain, final checkpoint and summary (no final eval).
  void request_stop(const std::string& reason);
  bool finished() const { return finished_; }
  // A supervisor's news of a worker (what WeightWatcher::restarting / restarted do with it): it died
  // and will be started again; it was started again and answers (holding no weights).
  void worker_restarting(const std::string& worker) { watcher_->restarting(worker); }
  void worker_restarted(const std::string& worker) { watcher_->restarted(worker); }
  const RunSummary& summary() const { return summary_; }
  // Completes when finished (the observer heard on_end).
  Awaitable<RunSummary> wait();

  const Ledger& ledger() const { return ledger_; }
  RolloutDispatcher& dispatcher() { return *dispatcher_; }
  TrainSink& train_sink() { return *train_sink_; }
  EvalSink& eval_sink() { return *eval_sink_; }
  WeightWatcher& weight_watcher() { return *watcher_; }
  const Options& options() const { return opt_; }
  // The run's position: the last step cut and the version the workers are being served.
  std::int64_t step() const { return train_sink_->steps_cut(); }
  Version version() const { return dispatcher_->version(); }
  std::vector<std::string> workers() const { return ports_.inference->workers(); }
  const std::vector<StepReport>& step_reports() const { return steps_; }
  // Warnings so far that the trainer was not heard from (Options::trainer_alarm while it is silent).
  std::uint64_t trainer_silence_alarms() const { return trainer_silence_alarms_; }

 private:
  Awaitable<void> main_loop(std::int64_t start_step);
  Awaitable<void> read_worker_weights();
  Awaitable<void> watch_trainer();
  void on_step(const StepReport& r);
  void on_synced(const SyncReport& r);
  void on_fatal(Error e);
  void tick();
  CheckpointState checkpoint_state(std::int64_t step) const;
  Status save_checkpoint(std::int64_t step);
  Status restore(std::int64_t& start_step);
  Awaitable<Status> resend_journal();
  void finish();
  void summarize();

  boost::asio::io_context& io_;
  Ports ports_;
  Options opt_;
  RunObserver silent_;     // the observer when none is given
  RunObserver* observer_;  // never null
  Ledger ledger_;
  std::unique_ptr<RolloutDispatcher> dispatcher_;
  std::unique_ptr<JournalingTrainer> journal_;  // checkpointing on: every batch is journaled first
  std::vector<TrainBatch> resend_;              // resume: journaled batches to send again first
  std::unique_ptr<TrainSink> train_sink_;
  std::unique_ptr<EvalSink> eval_sink_;
  std::unique_ptr<WeightWatcher> watcher_;
  std::unique_ptr<PeriodicLogger> logger_;
  std::unique_ptr<LagProbe> lag_;
  Signal finished_signal_;

  bool started_ = false;
  bool finished_ = false;
  bool stop_requested_ = false;
  std::optional<Error> fatal_;
  bool start_eval_done_ = false;
  std::int64_t last_eval_version_ = -1;
  TimePoint run_start_{};
  TimePoint last_step_at_{};
  std::uint64_t tokens_at_last_step_ = 0;
  std::uint64_t tokens_at_last_tick_ = 0;
  TimePoint last_tick_at_{};
  double last_sync_seconds_ = 0.0;
  TimePoint trainer_heard_at_{};  // the trainer's last sign of life (TrainerPort::on_alive)
  bool trainer_heard_ = false;
  std::uint64_t trainer_silence_alarms_ = 0;
  double wait_at_last_step_ = 0.0;  // dispatcher's cumulative gate wait at the previous step
  std::vector<StepReport> steps_;
  RunSummary summary_;
};

}  // namespace arlo::orch
