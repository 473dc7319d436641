#pragma once
// Launcher: starts the run's child processes (arlo-worker x N, arlo-trainer), forwards their output
// line by line with a "[name] " prefix, reports when one exits, and stops them all — never leaving
// orphans:
//   - every child is put in one process group owned by the launcher, so a stop reaches the whole
//     group (grandchildren included) with one kill(-pgid, ...);
//   - every child asks the kernel for SIGKILL when its parent dies (prctl PR_SET_PDEATHSIG), so
//     even a SIGKILLed arlo takes its children with it;
//   - stop() sends SIGTERM, waits up to a grace period, then SIGKILLs and reaps.
// The destructor stops everything still running.
//
// RestartPolicy is the supervision rule a caller applies when a child dies during a run: restart
// it after a backoff, within a bound (below).
//
// Thread-safety: spawn/stop/exited from one thread; output forwarding runs on one reader thread per
// child and calls the line sink from there (the default sink writes to stdout under a mutex).
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/result.h"
#include "orchestrator/types.h"

namespace arlo::session {

struct ChildSpec {
  std::string name;                         // log prefix: "worker-0"
  std::vector<std::string> argv;            // argv[0] is looked up in PATH unless it has a '/'
  std::map<std::string, std::string> env;   // added to the inherited environment
  std::vector<std::string> restart_argv{};  // the argv of a restart; empty: argv again
};

struct ChildExit {
  std::string name;
  pid_t pid = 0;
  int status = 0;                // as from waitpid
  std::string describe() const;  // "worker-0 exited with code 1" / "... killed by signal 9"
};

class Launcher {
 public:
  using LineSink = std::function<void(const std::string& name, const std::string& line)>;
  explicit Launcher(LineSink sink = {});
  ~Launcher();
  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;

  Result<pid_t> spawn(const ChildSpec& spec);
  // A child that has exited since the last call (reaped), if any. Never blocks.
  std::optional<ChildExit> exited();
  // SIGTERM to the group, up to `grace` for them to exit, then SIGKILL; reaps all. Idempotent.
  void stop(std::chrono::milliseconds grace = std::chrono::seconds(5));
  std::vector<pid_t> running() const;
  pid_t process_group() const { return pgid_; }

 private:
  struct Child {
    std::string name;
    pid_t pid = 0;
    bool reaped = false;
    std::thread reader;
  };
  LineSink sink_;
  pid_t pgid_ = 0;
  std::vector<std::unique_ptr<Child>> children_;
};

// When a supervised child dies: restart it after a backoff that doubles with each restart within
// `window` (initial_backoff, 2x, 4x, ... capped at max_backoff), at most `max_restarts` times within
// `window`; the next death within it is past the bound (the run stops). A child that stays up
// longer than `window` starts again from the initial backoff. Pure bookkeeping: the caller passes
// the time of each death and does the waiting and the restart.
struct RestartLimits {
  int max_restarts = 5;
  orch::Duration window = std::chrono::minutes(10);
  orch::Duration initial_backoff = std::chrono::milliseconds(500);
  orch::Duration max_backoff = std::chrono::seconds(10);
};

class RestartPolicy {
 public:
  explicit RestartPolicy(RestartLimits limits = {}) : limits_(limits) {}
  // The child died at `now`: how long to wait before starting it again, or nullopt when it was
  // already restarted max_restarts times within the window (past the bound; nothing is counted).
  std::optional<orch::Duration> on_exit(orch::TimePoint now);
  // Restarts counted within the window ending at `now`.
  int recent(orch::TimePoint now);
  int total() const { return total_; }
  const RestartLimits& limits() const { return limits_; }

 private:
  RestartLimits limits_;
  std::vector<orch::TimePoint> restarts_;  // within the window, oldest first
  int total_ = 0;
};

// A free TCP port on 127.0.0.1 (bound and released; the caller's child binds it next).
Result<std::uint16_t> free_loopback_port();

}  // namespace arlo::session
