#pragma once
// Orchestrator: owns the five components on one io_context, the rollout ledger, the run directory
// outputs (metrics.jsonl, checkpoint, summary), the console line per step and the optional
// Prometheus status server. It does not own the ports; the caller builds them (real adapters in
// `arlo run`, fakes in tests) and keeps them alive until the orchestrator is destroyed.
//
// Lifecycle: start() (loads a checkpoint when options.resume), then run the io_context; the run
// ends after the batch for max_steps was accepted, the final version synced and the final eval
// reported (or on request_stop() / a fatal error); finished() turns true and result() holds the
// summary. Drain: in-flight train rollouts are cancelled ("drain"), queued groups are disposed of
// ("unused_at_drain"); the ledger must add up at the end, which the summary reports.
//
// Threading: construct, start and query on the io_context's thread.
#include <boost/asio/io_context.hpp>

#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/metrics.h"
#include "orchestrator/checkpoint.h"
#include "orchestrator/dispatcher.h"
#include "orchestrator/eval_sink.h"
#include "orchestrator/ledger.h"
#include "orchestrator/options.h"
#include "orchestrator/periodic_logger.h"
#include "orchestrator/rollout_log.h"
#include "orchestrator/ports.h"
#include "orchestrator/run_view.h"
#include "orchestrator/train_sink.h"
#include "orchestrator/weight_watcher.h"

namespace arlo::http {
class Server;
}

namespace arlo::orch {

struct Ports {
  InferencePort* inference = nullptr;
  TaskSource* tasks = nullptr;
  ScorerPort* scorer = nullptr;
  TrainerPort* trainer = nullptr;
  Clock* clock = nullptr;
  std::vector<Task> eval_tasks;  // the eval set (may be empty: no eval)
};

struct RunSummary {
  bool ok = true;
  std::string error;       // why the run stopped early
  std::int64_t steps = 0;  // last step whose batch the trainer accepted
  double seconds = 0.0;
  double reward_first5 = 0.0;  // mean train reward over the first 5 RL steps
  double reward_last5 = 0.0;   // ... and the last 5
  std::optional<EvalReport> eval_first;
  std::optional<EvalReport> eval_last;
  nlohmann::json ledger;
  // What each worker served at the end (GET /weights): {"<worker>": {"version", "checksum"} or {"error"}}.
  nlohmann::json workers = nlohmann::json::object();
  // The newest version the trainer announced: {"version", "checksum" ("" when it reported none),
  // "weight_sync": its announcement, endpoint included}.
  nlohmann::json trainer = nlohmann::json::object();
  std::string run_dir;
  nlohmann::json to_json() const;
};

class Orchestrator {
 public:
  Orchestrator(boost::asio::io_context& io, Ports ports, Options options, metrics::Registry* registry = nullptr);
  ~Orchestrator();
  Orchestrator(const Orchestrator&) = delete;
  Orchestrator& operator=(const Orchestrator&) = delete;

  // What the status server answers at "/" (session/ gives it the live run page); before start().
  // Without one, "/" names the routes that are served.
  void serve_page(std::string_view html) { page_ = html; }
  Status start();
  // Graceful stop: no new batches, drain, final checkpoint and summary (no final eval).
  void request_stop(const std::string& reason);
  bool finished() const { return finished_; }
  const RunSummary& summary() const { return summary_; }
  // Completes when finished and the status port has closed (status_linger after the end).
  Awaitable<RunSummary> wait();

  const Ledger& ledger() const { return ledger_; }
  RolloutDispatcher& dispatcher() { return *dispatcher_; }
  TrainSink& train_sink() { return *train_sink_; }
  EvalSink& eval_sink() { return *eval_sink_; }
  WeightWatcher& weight_watcher() { return *watcher_; }
  const Options& options() const { return opt_; }
  std::uint16_t status_port() const;
  // The records written to metrics.jsonl this process (what GET /api/records serves).
  const RecordLog& records() const { return records_; }
  // GET /api/status: the run's position, the ledger and each worker's state.
  nlohmann::json status_json() const;
  const std::vector<StepReport>& step_reports() const { return steps_; }
  // Warnings so far that the trainer was not heard from (Options::trainer_alarm while it is silent).
  std::uint64_t trainer_silence_alarms() const { return trainer_silence_alarms_; }

 private:
  Awaitable<void> main_loop(std::int64_t start_step);
  Awaitable<void> read_worker_weights();
  Awaitable<void> watch_trainer();
  void on_step(const StepReport& r);
  void on_synced(const SyncReport& r);
  void on_eval(const EvalReport& r);
  void on_fatal(Error e);
  void tick();
  void emit(const char* kind, nlohmann::json record);
  void print_step_line(const StepReport& r, double step_s, double tok_s);
  void add_status_routes();
  CheckpointState checkpoint_state(std::int64_t step) const;
  Status save_checkpoint(std::int64_t step);
  Status restore(std::int64_t& start_step);
  Awaitable<Status> resend_journal();
  void finish();
  void close();  // the status port, then wait() completes

  boost::asio::io_context& io_;
  Ports ports_;
  Options opt_;
  metrics::Registry* registry_;
  Ledger ledger_;
  std::unique_ptr<RolloutDispatcher> dispatcher_;
  std::unique_ptr<JournalingTrainer> journal_;  // checkpointing on: every batch is journaled first
  std::vector<TrainBatch> resend_;              // resume: journaled batches to send again first
  std::unique_ptr<TrainSink> train_sink_;
  std::unique_ptr<EvalSink> eval_sink_;
  std::unique_ptr<WeightWatcher> watcher_;
  std::unique_ptr<PeriodicLogger> logger_;
  std::unique_ptr<LagProbe> lag_;
  std::unique_ptr<http::Server> status_;
  std::string_view page_;  // served at "/"
  Signal finished_signal_;

  std::FILE* metrics_file_ = nullptr;
  RolloutLog rollout_log_;
  bool tty_ = false;
  bool started_ = false;
  bool finished_ = false;
  bool closed_ = false;
  std::unique_ptr<Timer> linger_;
  bool stop_requested_ = false;
  std::optional<Error> fatal_;
  bool start_eval_done_ = false;
  std::int64_t last_eval_version_ = -1;
  TimePoint run_start_{};
  TimePoint last_step_at_{};
  std::uint64_t tokens_at_last_step_ = 0;
  std::uint64_t tokens_at_last_tick_ = 0;
  TimePoint last_tick_at_{};
  std::uint64_t failed_at_last_line_ = 0;  // console: counts at the previous printed step line
  std::uint64_t cancelled_at_last_line_ = 0;
  double last_sync_seconds_ = 0.0;
  TimePoint trainer_heard_at_{};  // the trainer's last sign of life (TrainerPort::on_alive)
  bool trainer_heard_ = false;
  std::uint64_t trainer_silence_alarms_ = 0;
  double wait_at_last_step_ = 0.0;  // dispatcher's cumulative gate wait at the previous step
  nlohmann::json last_trainer_metrics_ = nlohmann::json::object();
  RecordLog records_;
  std::map<std::string, WorkerState> workers_;
  StepLinePacer pacer_;
  double started_at_ = 0.0;  // unix seconds
  std::vector<StepReport> steps_;
  RunSummary summary_;
};

}  // namespace arlo::orch
