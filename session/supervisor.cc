#include "session/supervisor.h"

#include <sys/wait.h>

#include <algorithm>
#include <csignal>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

namespace arlo::session {

std::string_view to_string(SupervisionEventKind kind) {
  switch (kind) {
    case SupervisionEventKind::kStarted: return "started";
    case SupervisionEventKind::kHealthy: return "healthy";
    case SupervisionEventKind::kUnhealthy: return "unhealthy";
    case SupervisionEventKind::kExited: return "exited";
    case SupervisionEventKind::kRestarting: return "restarting";
    case SupervisionEventKind::kGaveUp: return "gave_up";
  }
  return "?";
}

std::string_view to_string(GaveUpReason reason) {
  switch (reason) {
    case GaveUpReason::kNone: return "none";
    case GaveUpReason::kNotRestartable: return "not restartable";
    case GaveUpReason::kFinalExitCode: return "final exit code";
    case GaveUpReason::kPastTheBound: return "past the restart bound";
    case GaveUpReason::kRestartFailed: return "restart failed";
  }
  return "?";
}

namespace {
SupervisionEvent event(SupervisionEventKind kind, const std::string& name, pid_t pid) {
  SupervisionEvent e;
  e.kind = kind;
  e.name = name;
  e.pid = pid;
  return e;
}
}  // namespace

nlohmann::json to_json(const SupervisionEvent& e) {
  const auto secs = [](orch::Duration d) { return std::chrono::duration<double>(d).count(); };
  nlohmann::json j;
  j["event"] = std::string(to_string(e.kind));
  j["name"] = e.name;
  if (!e.group.empty()) j["group"] = e.group;
  if (e.pid != 0) j["pid"] = e.pid;
  if (e.kind == SupervisionEventKind::kStarted || e.kind == SupervisionEventKind::kHealthy)
    j["restarted"] = e.restarted;
  if (e.exit && WIFEXITED(e.exit->status)) j["exit_code"] = WEXITSTATUS(e.exit->status);
  if (e.exit && WIFSIGNALED(e.exit->status)) j["signal"] = WTERMSIG(e.exit->status);
  if (e.exit) j["exited_pid"] = e.exit->pid;
  if (e.kind == SupervisionEventKind::kRestarting) {
    j["attempt"] = e.attempt;
    j["delay_s"] = secs(e.delay);
  }
  if (e.max_restarts > 0) {
    j["max_restarts"] = e.max_restarts;
    j["window_s"] = secs(e.window);
  }
  if (e.kind == SupervisionEventKind::kHealthy) {
    j["http_status"] = e.http_status;
    j["since_start_s"] = secs(e.since_start);
    j["first_since_start"] = e.first_since_start;
  }
  if (e.kind == SupervisionEventKind::kUnhealthy) j["failed_probes"] = e.failed_probes;
  if (e.kind == SupervisionEventKind::kGaveUp) j["gave_up"] = std::string(to_string(e.gave_up));
  if (!e.reason.empty()) j["reason"] = e.reason;
  return j;
}

Supervisor::Supervisor(boost::asio::io_context& io, Clock& clock, Listener listener, Options options)
    : io_(io), clock_(clock), listener_(std::move(listener)), options_(options), changed_(io.get_executor()) {
  http::ClientOptions co;
  co.retry.max_attempts = 1;
  co.clock = &clock_;
  client_ = std::make_unique<http::Client>(io_, co);
}

Supervisor::~Supervisor() {
  *alive_ = false;
  stop();
}

void Supervisor::emit(const SupervisionEvent& event) {
  changed_.notify();
  if (!stopped_ && listener_) listener_(event);
}

Status Supervisor::start(const ChildSpec& spec, Supervision supervision) {
  auto pid = children_.spawn(spec);
  if (!pid) return std::unexpected(pid.error());
  Entry& entry = entries_[spec.name];
  entry.child = true;
  if (!supervision.group.empty()) {
    Group& group = groups_[supervision.group];
    if (group.members.empty() && supervision.restart) group.policy.emplace(*supervision.restart);
    if (std::find(group.members.begin(), group.members.end(), spec.name) == group.members.end())
      group.members.push_back(spec.name);
  } else if (supervision.restart) {
    entry.policy.emplace(*supervision.restart);
  }
  entry.supervision = std::move(supervision);
  begin_life(entry, *pid);
  SupervisionEvent ev = event(SupervisionEventKind::kStarted, spec.name, *pid);
  ev.group = entry.supervision.group;
  emit(ev);
  ensure_ticking();
  return ok();
}

void Supervisor::watch(const std::string& name, HealthCheck health) {
  Entry& entry = entries_[name];
  entry.supervision.health = std::move(health);
  begin_life(entry, 0);
  ensure_ticking();
}

void Supervisor::begin_life(Entry& entry, pid_t pid) {
  entry.pid = pid;
  entry.running = true;
  ++entry.life;
  entry.started_at = clock_.now();
  entry.healthy = false;
  entry.ever_healthy = false;
  entry.failures = 0;
  entry.next_probe = clock_.now();
}

void Supervisor::ensure_ticking() {
  if (stopped_ || tick_timer_) return;
  tick_timer_ = clock_.schedule(clock_.now() + options_.tick, [this] {
    tick_timer_.reset();
    tick();
    ensure_ticking();
  });
}

void Supervisor::tick() {
  if (stopped_) return;
  // Exits reaped together are handled those killed by a signal first: when a rank is killed, the
  // others of its group fail in their next collective, and the group's restart names the cause.
  std::vector<ChildExit> exits;
  while (auto e = children_.next_exit()) exits.push_back(std::move(*e));
  std::stable_partition(exits.begin(), exits.end(), [](const ChildExit& e) { return WIFSIGNALED(e.status); });
  for (const auto& e : exits) {
    on_exit(e);
    if (stopped_) return;
  }
  const auto now = clock_.now();
  for (auto& [name, entry] : entries_) {
    if (!entry.running || !entry.supervision.health || entry.probing || now < entry.next_probe) continue;
    entry.probing = true;
    arlo::spawn(io_.get_executor(),
                probe(name, entry.life, entry.supervision.health->url, entry.supervision.health->timeout, alive_));
  }
}

Awaitable<void> Supervisor::probe(std::string name, std::uint64_t life, std::string url, orch::Duration timeout,
                                  std::shared_ptr<bool> alive) {
  auto r = co_await client_->get(url + "/health", timeout);
  if (!*alive) co_return;
  auto it = entries_.find(name);
  if (it == entries_.end()) co_return;
  it->second.probing = false;
  if (it->second.life != life || !it->second.running) co_return;  // an answer from a previous life
  on_probe(name, r ? r->status : 0, r ? std::string() : r.error().what());
}

void Supervisor::on_probe(const std::string& name, int status, const std::string& error) {
  Entry& entry = entries_.at(name);
  const HealthCheck& check = *entry.supervision.health;
  ++entry.probes;
  const auto now = clock_.now();
  const bool answers_any = entry.with_restart_argv && check.restarted_answers_any;
  const bool ok = status == 200 || (status != 0 && answers_any);
  if (ok) {
    entry.failures = 0;
    if (!entry.healthy) {
      entry.healthy = true;
      SupervisionEvent ev = event(SupervisionEventKind::kHealthy, name, entry.pid);
      ev.restarted = entry.life > 1;
      ev.first_since_start = !entry.ever_healthy;
      ev.since_start = now - entry.started_at;
      ev.http_status = status;
      entry.ever_healthy = true;
      emit(ev);
    } else {
      changed_.notify();
    }
  } else {
    ++entry.failures;
    if (entry.healthy && entry.failures >= check.unhealthy_after) {
      entry.healthy = false;
      SupervisionEvent ev = event(SupervisionEventKind::kUnhealthy, name, entry.pid);
      ev.failed_probes = entry.failures;
      ev.reason = status != 0 ? fmt::format("{}/health answered {}", check.url, status)
                              : fmt::format("{}/health: {}", check.url, error);
      emit(ev);
    }
  }
  entry.next_probe = now + (entry.healthy ? check.interval : check.starting_interval);
}

void Supervisor::on_exit(const ChildExit& e) {
  auto it = entries_.find(e.name);
  if (it == entries_.end()) return;
  Entry& entry = it->second;
  if (entry.child && e.pid != entry.pid) return;  // a previous life, stopped by its group's restart
  entry.running = false;
  entry.healthy = false;
  SupervisionEvent ev = event(SupervisionEventKind::kExited, e.name, e.pid);
  ev.group = entry.supervision.group;
  ev.exit = e;
  ev.last_lines = children_.tail(e.name);
  emit(ev);
  if (stopped_) return;
  if (ev.group.empty()) return decide(entry, ev);
  if (groups_.at(ev.group).restarting) return restart_group(ev.group);  // one the group's restart stopped
  decide_group(ev.group, ev);
}

// After an exit: a restart after the policy's backoff, or the end of this child's supervision.
void Supervisor::decide(Entry& entry, const SupervisionEvent& exited) {
  SupervisionEvent ev = verdict(entry.supervision, entry.policy, exited);
  if (ev.kind == SupervisionEventKind::kRestarting)
    entry.restart_timer = clock_.schedule(clock_.now() + ev.delay, [this, name = exited.name] { restart_now(name); });
  emit(ev);
}

// The exit of a group's member: the group's restart (the others stopped, then all started again) or
// the end of the group's supervision (the run stops every child).
void Supervisor::decide_group(const std::string& name, const SupervisionEvent& exited) {
  Group& group = groups_.at(name);
  const Entry& entry = entries_.at(group.members.front());
  SupervisionEvent ev = verdict(entry.supervision, group.policy, exited);
  if (ev.kind == SupervisionEventKind::kRestarting) {
    const auto now = clock_.now();
    group.restarting = true;
    group.ready_at = now + ev.delay;
    ev.reason = fmt::format("{}: stopping the other members of {} ({}) and starting all {} again",
                            exited.exit->describe(), name, fmt::join(group.members, ", "), group.members.size());
    signal_group(name, SIGTERM);
    group.kill_timer =
        clock_.schedule(now + entry.supervision.group_grace, [this, name] { signal_group(name, SIGKILL); });
    group.restart_timer = clock_.schedule(group.ready_at, [this, name] { restart_group(name); });
  }
  emit(ev);
}

// `signal` to every member of the group still running (not reaped, so its pid is still its own).
void Supervisor::signal_group(const std::string& name, int signal) {
  for (const auto& member : groups_.at(name).members)
    if (const Entry& entry = entries_.at(member); entry.running && entry.pid > 0) ::kill(entry.pid, signal);
}

// Starts every member again once all are down and the backoff passed (called by the backoff's timer
// and by each stopped member's exit).
void Supervisor::restart_group(const std::string& name) {
  Group& group = groups_.at(name);
  if (stopped_ || !group.restarting || clock_.now() < group.ready_at) return;
  for (const auto& member : group.members)
    if (entries_.at(member).running) return;
  group.restarting = false;
  group.kill_timer.reset();
  const auto& make_env = entries_.at(group.members.front()).supervision.group_restart_env;
  const auto env = make_env ? make_env() : std::map<std::string, std::string>{};
  const auto members = group.members;  // restart_now may stop the run through the listener
  for (const auto& member : members) {
    if (stopped_) return;
    children_.update_env(member, env);
    restart_now(member);
  }
}

// The decision after an exit under `supervision` and `policy`: restarting (after ev.delay) or gave_up.
SupervisionEvent Supervisor::verdict(const Supervision& supervision, std::optional<RestartPolicy>& policy,
                                     const SupervisionEvent& exited) {
  SupervisionEvent ev = exited;
  ev.kind = SupervisionEventKind::kGaveUp;
  ev.pid = 0;
  const int status = exited.exit->status;
  const auto& finals = supervision.final_exit_codes;
  const auto now = clock_.now();
  if (!policy) {
    ev.gave_up = GaveUpReason::kNotRestartable;
    ev.reason = fmt::format("{} (not restarted)", exited.exit->describe());
  } else if (WIFEXITED(status) && std::find(finals.begin(), finals.end(), WEXITSTATUS(status)) != finals.end()) {
    ev.gave_up = GaveUpReason::kFinalExitCode;
    ev.reason = fmt::format("{} (exit code {} is final: not restarted)", exited.exit->describe(), WEXITSTATUS(status));
  } else if (auto delay = policy->on_exit(now)) {
    ev.kind = SupervisionEventKind::kRestarting;
    ev.delay = *delay;
    ev.attempt = policy->recent(now);
    ev.max_restarts = policy->limits().max_restarts;
    ev.window = policy->limits().window;
  } else {
    ev.gave_up = GaveUpReason::kPastTheBound;
    ev.max_restarts = policy->limits().max_restarts;
    ev.window = policy->limits().window;
    ev.reason = fmt::format("{}, after {} restarts within {} s: not restarted again", exited.exit->describe(),
                            ev.max_restarts, std::chrono::duration_cast<std::chrono::seconds>(ev.window).count());
  }
  return ev;
}

void Supervisor::restart_now(const std::string& name) {
  Entry& entry = entries_.at(name);
  entry.restart_timer.reset();
  if (stopped_) return;
  const bool with_restart_argv = use_restart_argv_;
  auto pid = children_.restart(name, /*as_first_started=*/!with_restart_argv);
  if (!pid) {
    SupervisionEvent ev = event(SupervisionEventKind::kGaveUp, name, 0);
    ev.gave_up = GaveUpReason::kRestartFailed;
    ev.reason = pid.error().what();
    emit(ev);
    return;
  }
  begin_life(entry, *pid);
  entry.with_restart_argv = with_restart_argv;
  SupervisionEvent ev = event(SupervisionEventKind::kStarted, name, *pid);
  ev.group = entry.supervision.group;
  ev.restarted = true;
  emit(ev);
}

Awaitable<Status> Supervisor::wait_healthy(std::vector<std::string> names, Clock::time_point deadline) {
  for (;;) {
    const std::string* missing = nullptr;
    for (const auto& name : names)
      if (!healthy(name)) {
        missing = &name;
        break;
      }
    if (missing == nullptr) co_return ok();
    if (stopped_)
      co_return make_error(ErrorCode::kCancelled,
                           fmt::format("stopped while waiting for {} to answer /health", *missing));
    if (clock_.now() >= deadline) {
      auto it = entries_.find(*missing);
      const std::string url =
          it != entries_.end() && it->second.supervision.health ? it->second.supervision.health->url : "";
      co_return make_error(
          ErrorCode::kTimeout,
          fmt::format("{} at {} did not answer /health in time; its last lines:\n{}", *missing, url, tail(*missing)));
    }
    co_await changed_.wait_until(clock_, deadline);
  }
}

bool Supervisor::healthy(const std::string& name) const {
  auto it = entries_.find(name);
  return it != entries_.end() && it->second.healthy;
}

std::uint64_t Supervisor::probes(const std::string& name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? 0 : it->second.probes;
}

void Supervisor::stop(std::chrono::milliseconds grace) {
  if (!stopped_) {
    stopped_ = true;
    tick_timer_.reset();
    for (auto& [name, entry] : entries_) entry.restart_timer.reset();
    for (auto& [name, group] : groups_) {
      group.restart_timer.reset();
      group.kill_timer.reset();
    }
    changed_.notify();
  }
  children_.stop(grace);
}

}  // namespace arlo::session
