#pragma once
// The run's monitors (monitors.use: wandb, tensorboard): one helper process each, running
// python/arlo_monitor.py under the project's Python environment, following the run's record stream
// (<run dir>/metrics.jsonl) into Weights & Biases or TensorBoard.
//
// A monitor never costs the run: the record stream is a file the run appends to whatever a monitor
// does (nothing waits on it and nothing is dropped: a monitor that was slow or dead catches up from
// the offset it keeps in <run dir>/monitors/<kind>.json). One that dies is started again after a
// backoff (0.5 s doubling to 30 s) with a warning and its last lines; past 10 restarts within 10
// minutes it is given up with an error, and the run goes on without it. finish() lets each log what
// is left and the run's summary before it is stopped.
//
// A Supervisor of their own (session/supervisor.h) runs them: their own process group, stopped by
// finish() before the rest of the run.
//
// Thread-safety: everything from the event loop's thread.
#include <boost/asio/io_context.hpp>

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "config/config.h"
#include "common/result.h"
#include "common/async/clock.h"
#include "session/launcher.h"
#include "session/supervisor.h"

namespace arlo::session {

// One helper per entry of monitors.use, with its settings; none when the list is empty.
std::vector<ChildSpec> monitor_specs(const config::Config& cfg, const std::string& run_dir);

class Monitors {
 public:
  Monitors(boost::asio::io_context& io, std::vector<ChildSpec> specs);
  ~Monitors();
  Monitors(const Monitors&) = delete;
  Monitors& operator=(const Monitors&) = delete;

  // Starts every monitor and its supervision. A monitor that cannot be started at all (no such
  // interpreter) is an error: a configuration problem, found before the run spends anything.
  Status start();
  // The run ended: each monitor gets a SIGTERM and up to `grace` to log the rest and finish.
  void finish(std::chrono::seconds grace);
  // How many times each monitor was restarted so far, by name.
  const std::map<std::string, int>& restarts() const { return restarts_; }

 private:
  void on_event(const SupervisionEvent& e);

  std::vector<ChildSpec> specs_;
  RealClock clock_;
  std::map<std::string, int> restarts_;
  bool finished_ = false;
  Supervisor supervisor_;  // last: stopped first
};

}  // namespace arlo::session
