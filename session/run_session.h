#pragma once
// One `arlo run`, as a library object: built from a validated configuration, a RunSession owns what
// the run starts and wires: the children (embedded workers, the trainer) through the launcher, the
// real adapters (worker pool and admin clients, task stream, reward scorer, bridge trainer) and the
// orchestrator on one event loop. run() drives it until the run ends and stops every child on the
// way out: normal end, error, or SIGINT/SIGTERM (a second signal stops the children at once).
//
// Order matters: workers must answer /health before the orchestrator starts dispatching; the
// orchestrator registers its trainer callback (start()) before the bridge starts; the trainer is
// started after the bridge so a socket bridge has a port to give it.
//
// The command line (apps/arlo) loads and validates the configuration, sets up logging, creates the
// session, and turns its outcome into messages and exit codes.
#include <cstdint>
#include <memory>
#include <string>

#include "config/config.h"
#include "common/result.h"
#include "orchestrator/observer.h"

namespace arlo::session {

// The facts of a run that come from the command line rather than the configuration.
struct SessionOptions {
  bool resume = false;     // continue from the run directory's last checkpoint
  bool overwrite = false;  // start over in a run directory that holds a previous run
  // Told what the loop reports (each step, weight sync, eval, pipeline view and the end), after the
  // run's own reporter; it must outlive run(). Tests observe a run through it.
  orch::RunObserver* observer = nullptr;
};

// How a run ended.
struct RunOutcome {
  enum class End {
    kFinished,  // ran to its end (run.max_steps or the task stream)
    kStopped,   // stopped by a signal, gracefully (drain, final checkpoint)
    kFailed,    // an error stopped it: `error` says why
  };
  End end = End::kFailed;
  std::string error;        // kFailed: what went wrong (a child's exit with its last lines, ...)
  std::string stop_reason;  // kStopped: "signal N"
  std::int64_t steps = 0;   // trainer steps completed (kFinished, kStopped)
  double seconds = 0;       // wall time of the run (kFinished)
};

class RunSession {
 public:
  // Prepares the run before anything starts: the orchestrator's options, the run directory
  // (created; without `resume`, one holding a previous run is refused unless `overwrite` clears it),
  // the rollout parts, the launch plan (ports, child argv, the weight-sync plan) and the run's
  // token ($ARLO_TOKEN for the children). Fails with a message citing the config location; the
  // command line reports that as a configuration problem.
  static Result<std::unique_ptr<RunSession>> create(const config::Config& cfg, const SessionOptions& options);
  ~RunSession();
  RunSession(const RunSession&) = delete;
  RunSession& operator=(const RunSession&) = delete;

  // The run directory, absolute.
  const std::string& run_dir() const;

  // Runs to the end (call once). Every child is stopped when it returns.
  RunOutcome run();

 private:
  class Impl;
  explicit RunSession(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace arlo::session
