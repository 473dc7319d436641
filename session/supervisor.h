#pragma once
// Supervisor: the child processes of a run (arlo-worker x N, the trainer, the monitors) and the
// endpoints it waits on (external inference servers), watched by one poller on a Clock
// (common/async/clock.h; a FakeClock in tests). Each tick of the poller reaps the children that
// exited and sends GET <url>/health to every child or endpoint whose probe is due. What it sees
// becomes structured events for one listener (the run logs and acts on them; tests assert on them):
//   started    a child was spawned (again: `restarted`)
//   healthy    it answered /health (200; or any answer once restarted with its restart_argv, when
//              the check says so: an arlo-worker without weights answers 503 until it is updated)
//   unhealthy  a healthy one failed `unhealthy_after` probes in a row (no answer or not healthy)
//   exited     a child ended (its waitpid status and last lines)
//   restarting it will be started again after `delay` (restart `attempt` of `max_restarts` within
//              `window`: RestartPolicy, session/launcher.h)
//   gave_up    it will not be: its exit is final (not restartable, a final exit code, past the
//              restart bound) or the restart itself failed; `reason` says so in words
// Children of one group (Supervision::group: the ranks of a data-parallel trainer) live and die
// together: when one exits, the decision is the group's (its restart limits, counted once per group
// restart), the others get SIGTERM and SIGKILL after group_grace, and once every member is down and
// the backoff passed, all start again (started, restarted), their environment updated by
// group_restart_env (a fresh MASTER_PORT). The exits of the members it stopped are `exited` events
// with `group` set and no decision of their own.
// The restart waits run on the Clock as well. stop() (and the destructor) stops every child: no
// orphans (Launcher), and no event after it.
//
// Thread-safety: everything on the io_context's thread (the clock's); the listener runs there.
#include <boost/asio/io_context.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/async/clock.h"
#include "common/async/coro.h"
#include "common/http.h"
#include "common/result.h"
#include "session/children.h"
#include "session/launcher.h"

namespace arlo::session {

// How one child (or endpoint) is probed: GET <url>/health.
struct HealthCheck {
  std::string url;
  orch::Duration starting_interval = std::chrono::milliseconds(100);  // between probes until healthy
  orch::Duration interval = std::chrono::seconds(2);                  // between probes once healthy
  orch::Duration timeout = std::chrono::seconds(1);                   // per probe, on the clock
  int unhealthy_after = 3;  // failed probes in a row that make a healthy one unhealthy
  // Started again with its restart_argv, it is healthy once it answers at all (any status).
  bool restarted_answers_any = false;
};

// How one child is supervised.
struct Supervision {
  std::optional<RestartLimits> restart;  // nullopt: its exit is final
  std::optional<HealthCheck> health;     // nullopt: not probed
  std::vector<int> final_exit_codes;     // exit codes never restarted (a usage error fails again)
  // The group this child lives and dies with (empty: none); restart, final_exit_codes, group_grace
  // and group_restart_env are the first member's.
  std::string group{};
  orch::Duration group_grace = std::chrono::seconds(5);                     // SIGTERM to SIGKILL for the other members
  std::function<std::map<std::string, std::string>()> group_restart_env{};  // called once per group restart
};

enum class SupervisionEventKind { kStarted, kHealthy, kUnhealthy, kExited, kRestarting, kGaveUp };
enum class GaveUpReason { kNone, kNotRestartable, kFinalExitCode, kPastTheBound, kRestartFailed };
std::string_view to_string(SupervisionEventKind kind);
std::string_view to_string(GaveUpReason reason);

struct SupervisionEvent {
  SupervisionEventKind kind = SupervisionEventKind::kStarted;
  std::string name;
  std::string group;               // the child's Supervision::group (empty: none)
  pid_t pid = 0;                   // started, exited: the process
  bool restarted = false;          // started, healthy: this life is a restart
  bool first_since_start = false;  // healthy: the first since it was (re)started
  std::optional<ChildExit> exit;   // exited, restarting, gave_up after an exit
  std::string last_lines;          // exited, restarting, gave_up after an exit: the child's last lines
  int attempt = 0;                 // restarting: restarts within the window, this one included
  int max_restarts = 0;            // restarting, gave_up (past the bound): the bound ...
  orch::Duration window{};         // ... within this window
  orch::Duration delay{};          // restarting: the wait before the restart
  orch::Duration since_start{};    // healthy: since it was (re)started
  int http_status = 0;             // healthy: the answer
  int failed_probes = 0;           // unhealthy
  GaveUpReason gave_up = GaveUpReason::kNone;
  std::string reason;  // gave_up, unhealthy: in words
};

// The event as one JSON object (<run dir>/supervision.jsonl): "event", "name", and the fields that
// kind carries ("group" for a group's member, "pid", "restarted", "exit_code" or "signal" and "exited_pid", "attempt",
// "max_restarts", "window_s", "delay_s", "since_start_s", "http_status", "first_since_start",
// "failed_probes", "gave_up", "reason").
nlohmann::json to_json(const SupervisionEvent& e);

class Supervisor {
 public:
  using Listener = std::function<void(const SupervisionEvent&)>;
  struct Options {
    orch::Duration tick = std::chrono::milliseconds(100);  // exits are reaped each tick
  };
  Supervisor(boost::asio::io_context& io, Clock& clock, Listener listener, Options options);
  Supervisor(boost::asio::io_context& io, Clock& clock, Listener listener)
      : Supervisor(io, clock, std::move(listener), Options{}) {}
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Spawns the child (started) and supervises it; the poller starts with the first child or endpoint.
  Status start(const ChildSpec& spec, Supervision supervision = {});
  // Probes an endpoint that is not a child of this run (an external server).
  void watch(const std::string& name, HealthCheck health);
  // From now on a restart uses the child's restart_argv (ChildSpec); until then, the argv it first
  // started with.
  void use_restart_argv(bool on) { use_restart_argv_ = on; }
  // Completes when every named child or endpoint is healthy, or at `deadline` (kTimeout naming the
  // first that is not, with its URL and last lines).
  Awaitable<Status> wait_healthy(std::vector<std::string> names, Clock::time_point deadline);
  bool healthy(const std::string& name) const;
  bool supervises(const std::string& name) const { return entries_.count(name) > 0; }
  std::uint64_t probes(const std::string& name) const;  // completed so far
  // SIGTERM, up to `grace` for the children to exit, SIGKILL; no event after it. Idempotent.
  void stop(std::chrono::milliseconds grace = std::chrono::seconds(5));
  std::string tail(const std::string& name) const { return children_.tail(name); }

 private:
  struct Entry {
    bool child = false;  // a process (else an endpoint probed only)
    Supervision supervision;
    std::optional<RestartPolicy> policy;
    pid_t pid = 0;
    bool running = false;
    std::uint64_t life = 0;  // starts so far
    bool with_restart_argv = false;
    Clock::time_point started_at{};
    bool healthy = false;
    bool ever_healthy = false;  // since this start
    int failures = 0;
    bool probing = false;
    Clock::time_point next_probe{};
    std::uint64_t probes = 0;
    std::unique_ptr<Timer> restart_timer;
  };
  struct Group {
    std::vector<std::string> members;  // in start order
    std::optional<RestartPolicy> policy;
    bool restarting = false;  // its members are being stopped, then started again
    Clock::time_point ready_at{};
    std::unique_ptr<Timer> restart_timer;
    std::unique_ptr<Timer> kill_timer;
  };

  void ensure_ticking();
  void tick();
  void on_exit(const ChildExit& e);
  void decide(Entry& entry, const SupervisionEvent& exited);
  SupervisionEvent verdict(const Supervision& supervision, std::optional<RestartPolicy>& policy,
                           const SupervisionEvent& exited);
  void decide_group(const std::string& group, const SupervisionEvent& exited);
  void signal_group(const std::string& group, int signal);
  void restart_group(const std::string& group);
  void restart_now(const std::string& name);
  void begin_life(Entry& entry, pid_t pid);
  Awaitable<void> probe(std::string name, std::uint64_t life, std::string url, orch::Duration timeout,
                        std::shared_ptr<bool> alive);
  void on_probe(const std::string& name, int status, const std::string& error);
  void emit(const SupervisionEvent& event);

  boost::asio::io_context& io_;
  Clock& clock_;
  Listener listener_;
  Options options_;
  std::map<std::string, Entry> entries_;
  std::map<std::string, Group> groups_;
  bool use_restart_argv_ = false;
  bool stopped_ = false;
  std::unique_ptr<Timer> tick_timer_;
  Signal changed_;  // any health or life change, for wait_healthy
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
  std::unique_ptr<http::Client> client_;
  RunChildren children_;
};

}  // namespace arlo::session
