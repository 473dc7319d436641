#pragma once
// The child processes of an embedded `arlo run` (arlo-worker x N, arlo-trainer) on top of
// session::Launcher: finds the binaries, forwards each child's lines to stdout with a
// "[name] " prefix while keeping the last lines of each for error messages, reports exits
// (described with the child's last lines) and restarts a child from the spec it was spawned with;
// nothing starts once stop() was called. The Supervisor (session/supervisor.h) drives it. The Launcher
// (and so this class's destructor) stops every child: no orphans.
//
// Thread-safety: spawn/restart/next_exit/stop from the event loop's thread; the line sink runs on the
// launcher's reader threads and only touches the mutex-protected tails.
#include <chrono>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"
#include "session/launcher.h"

namespace arlo::session {

// The path of a sibling binary of this arlo: <dir of arlo>/<name>, <build>/apps/<name>/<name>, or
// the bare name (looked up in PATH by the launcher) when neither exists.
std::string find_binary(const std::string& name);

class RunChildren {
 public:
  static constexpr std::size_t kTailLines = 20;
  RunChildren();
  ~RunChildren();
  RunChildren(const RunChildren&) = delete;
  RunChildren& operator=(const RunChildren&) = delete;

  // The pid of the started child.
  Result<pid_t> spawn(const ChildSpec& spec);
  // Starts `name` again (same name, so its lines and tail continue) with its spec's restart_argv,
  // or the argv it was first started with when `as_first_started` or it has none; fails after stop().
  Result<pid_t> restart(const std::string& name, bool as_first_started = false);
  // Sets `env`'s variables in `name`'s spec: its next restart starts with them.
  void update_env(const std::string& name, const std::map<std::string, std::string>& env);
  // An exit since the last call (reaped); nullopt when none.
  std::optional<ChildExit> next_exit();
  // The exit described with the child's last lines.
  std::string describe(const ChildExit& e) const;
  // SIGTERM, up to `grace` for the children to exit, SIGKILL; idempotent.
  void stop(std::chrono::milliseconds grace = std::chrono::seconds(5));
  std::string tail(const std::string& name) const;

 private:
  void on_line(const std::string& name, const std::string& line);
  mutable std::mutex mu_;
  std::map<std::string, std::deque<std::string>> tails_;
  std::map<std::string, ChildSpec> specs_;  // as spawned, by name
  bool stopped_ = false;
  Launcher launcher_;
};

}  // namespace arlo::session
