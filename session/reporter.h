#pragma once
// Reporter: what users watch of a run, fed by the loop through orch::RunObserver. It writes
// metrics.jsonl (one record per step, weight sync, eval and pipeline tick; the W&B and TensorBoard
// monitors follow it), rollouts.jsonl, the console lines (step, pipeline, eval, summary) and
// summary.json; it keeps the metrics registry's gauges and serves the status port: the live run
// page at "/", /api/status, /api/records, /api/samples (the newest samples), /metrics and /health.
//
// Lifecycle: construct before the orchestrator (which takes it as its observer), start() before
// Orchestrator::start() (opens the files, starts the status server); after the end the status port
// stays open for options.status_linger, then wait_closed() completes. The orchestrator given to
// start() must outlive the reporter's status server (close() or the destructor).
//
// Threading: the orchestrator's io_context thread only.
#include <boost/asio/io_context.hpp>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/metrics.h"
#include "orchestrator/observer.h"
#include "orchestrator/options.h"
#include "session/rollout_log.h"
#include "session/run_view.h"

namespace arlo::http {
class Server;
}
namespace arlo::orch {
class Orchestrator;
}

namespace arlo::session {

// Several observers as one, each told in the order added (a null one is skipped).
class ObserverList : public orch::RunObserver {
 public:
  void add(orch::RunObserver* o) {
    if (o) list_.push_back(o);
  }
  void on_start(const orch::StartObservation& s) override { tell(&RunObserver::on_start, s); }
  void on_scored(const orch::Group& g) override { tell(&RunObserver::on_scored, g); }
  void on_step(const orch::StepObservation& s) override { tell(&RunObserver::on_step, s); }
  void on_sync(const orch::SyncObservation& s) override { tell(&RunObserver::on_sync, s); }
  void on_eval(const orch::EvalReport& r) override { tell(&RunObserver::on_eval, r); }
  void on_pipeline(const orch::PipelineView& v) override { tell(&RunObserver::on_pipeline, v); }
  void on_end(const orch::EndObservation& e) override { tell(&RunObserver::on_end, e); }

 private:
  template <typename Report>
  void tell(void (orch::RunObserver::*report)(const Report&), const Report& r) {
    for (auto* o : list_) (o->*report)(r);
  }

  std::vector<orch::RunObserver*> list_;
};

// summary.json: the run's summary as a JSON object.
nlohmann::json summary_json(const orch::RunSummary& s);

class Reporter : public orch::RunObserver {
 public:
  Reporter(boost::asio::io_context& io, Clock& clock, orch::Options options, metrics::Registry* registry = nullptr);
  ~Reporter() override;
  Reporter(const Reporter&) = delete;
  Reporter& operator=(const Reporter&) = delete;

  // What the status server answers at "/" (the live run page); before start(). Without one, "/"
  // names the routes that are served.
  void serve_page(std::string_view html) { page_ = html; }
  // Opens metrics.jsonl (a partial last line dropped) and rollouts.jsonl in the run directory, and
  // the status server when options.status_port >= 0.
  Status start(const orch::Orchestrator& orchestrator);
  // Completes when the run ended and the status port closed.
  Awaitable<void> wait_closed();

  std::uint16_t status_port() const;
  // The records written to metrics.jsonl this process (what GET /api/records serves).
  const RecordLog& records() const { return records_; }
  // GET /api/status: the run's position, the ledger and each worker's state.
  nlohmann::json status_json() const;

  void on_start(const orch::StartObservation& s) override;
  void on_scored(const orch::Group& g) override;
  void on_step(const orch::StepObservation& s) override;
  void on_sync(const orch::SyncObservation& s) override;
  void on_eval(const orch::EvalReport& r) override;
  void on_pipeline(const orch::PipelineView& v) override;
  void on_end(const orch::EndObservation& e) override;

 private:
  Status open_files();
  Status start_status_server();
  void add_status_routes();
  void emit(const char* kind, nlohmann::json record);
  void print_step_line(const orch::StepObservation& s);
  void add_multi_turn_figures(nlohmann::json& rec, const orch::StepObservation& s);
  void log_summary(const orch::EndObservation& e) const;
  void close();

  boost::asio::io_context& io_;
  Clock& clock_;
  orch::Options opt_;
  metrics::Registry* registry_;
  const orch::Orchestrator* orch_ = nullptr;
  std::unique_ptr<http::Server> status_;
  std::string_view page_;  // served at "/"
  std::FILE* metrics_file_ = nullptr;
  RolloutLog rollout_log_;
  RecordLog records_;
  std::map<std::string, WorkerState> workers_;
  StepLinePacer pacer_;
  bool tty_ = false;
  orch::TimePoint run_start_{};
  double started_at_ = 0.0;                // unix seconds
  std::uint64_t failed_at_last_line_ = 0;  // console: counts at the previous printed step line
  std::uint64_t cancelled_at_last_line_ = 0;
  std::uint64_t model_turns_at_last_step_ = 0;  // multi_turn/turns_mean: the counts when it was last written
  std::uint64_t trajectories_at_last_step_ = 0;
  nlohmann::json last_trainer_metrics_ = nlohmann::json::object();
  std::unique_ptr<Timer> linger_;
  bool closed_ = false;
  Signal closed_signal_;
};

}  // namespace arlo::session
