#pragma once
// RunObserver: what the loop tells whoever reports on a run (session/reporter.h writes metrics.jsonl,
// the console lines, rollouts.jsonl, the status page's feed and summary.json from it; tests record
// it). The loop calls it on the io_context's thread, in the order things happen, with plain records
// of figures it already computed; an observer only reads them and decides nothing for the loop.
//
//   on_start     the loop started (after a resume restored its position)
//   on_scored    a train group's scores arrived (before any filter)
//   on_step      the trainer accepted the batch of a step
//   on_sync      a weight-sync round ended (applied or not; not the round that stopped the run)
//   on_eval      an eval finished
//   on_pipeline  every log interval: the pipeline view
//   on_end       the run ended: its summary, once, after Orchestrator::finished() turned true
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "orchestrator/eval_sink.h"
#include "orchestrator/group.h"
#include "orchestrator/periodic_logger.h"
#include "orchestrator/train_sink.h"
#include "orchestrator/weight_watcher.h"

namespace arlo::orch {

// How the run ended; Orchestrator::summary() and wait() return it.
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
};

// Where the loop starts: after a resume, the restored step and ledger.
struct StartObservation {
  std::int64_t start_step = 0;   // the last step done before this process (0 on a fresh run)
  Version version = kNoVersion;  // the version the workers hold
  std::vector<std::string> workers;
  std::uint64_t failed = 0;  // rollouts so far (the ledger's totals)
  std::uint64_t cancelled = 0;
};

// A step whose batch the trainer accepted, with the loop's figures at that moment.
struct StepObservation {
  StepReport report;
  double step_seconds = 0.0;             // since the previous step (or the start)
  double tokens_per_s = 0.0;             // completion tokens per second over that time
  double wait_for_policy_seconds = 0.0;  // the dispatcher's gate wait over that time
  double last_sync_seconds = 0.0;        // the newest applied weight sync
  std::uint64_t completed = 0;           // rollouts so far (the ledger's totals)
  std::uint64_t failed = 0;
  std::uint64_t cancelled = 0;
  // Multi-turn trajectories so far: model turns completed, trajectories ended (completed, failed or
  // cancelled) and samples their environment failed (also in the ledger as failed "env_<code>").
  std::uint64_t model_turns = 0;
  std::uint64_t trajectories = 0;
  std::uint64_t env_failed = 0;
  std::map<std::string, std::uint64_t> ended_because;  // trajectories ended early, by the environment's reason
  nlohmann::json ledger;                               // Ledger::to_json(): where every sample went so far
};

// A weight-sync round that ended; `step` is the last step cut when it did.
struct SyncObservation {
  SyncReport report;
  std::int64_t step = 0;
  TimePoint at{};  // when it ended (the loop's clock)
};

// The end of the run, with the ledger's totals for the summary line.
struct EndObservation {
  RunSummary summary;
  std::uint64_t dispatched = 0;
  std::uint64_t completed = 0;
  std::uint64_t failed = 0;
  std::uint64_t cancelled = 0;
};

class RunObserver {
 public:
  virtual ~RunObserver() = default;
  virtual void on_start(const StartObservation&) {}
  virtual void on_scored(const Group&) {}
  virtual void on_step(const StepObservation&) {}
  virtual void on_sync(const SyncObservation&) {}
  virtual void on_eval(const EvalReport&) {}
  virtual void on_pipeline(const PipelineView&) {}
  virtual void on_end(const EndObservation&) {}
};

}  // namespace arlo::orch
