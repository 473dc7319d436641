// The Supervisor on the fake clock, with real child processes and a real local HTTP /health server:
// the assertions are on its events (session/supervisor.h), never on log text. A child's end is
// an event of its own (the test releases it through a FIFO, then waits for it to exit without
// reaping it); time moves only when the test advances the clock.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>

#include <cerrno>
#include <csignal>
#include <chrono>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/async/fake_clock.h"
#include "common/http.h"
#include "session/supervisor.h"
#include "tests/temp_dir.h"

namespace arlo::session {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Kind = SupervisionEventKind;
constexpr auto kTick = milliseconds(100);  // Supervisor::Options{}.tick

struct Recorder {
  std::vector<SupervisionEvent> events;
  Supervisor::Listener listener() {
    return [this](const SupervisionEvent& e) { events.push_back(e); };
  }
  std::vector<Kind> kinds() const {
    std::vector<Kind> k;
    for (const auto& e : events) k.push_back(e.kind);
    return k;
  }
};

// Blocks until `pid` has exited, leaving it to be reaped by the supervisor.
void wait_exited(pid_t pid) {
  siginfo_t info{};
  while (::waitid(P_PID, pid, &info, WEXITED | WNOWAIT) != 0 && errno == EINTR) {
  }
}

// A child that runs until the test releases it (opening and closing the FIFO's writing end), then
// exits with `code`.
struct Gate {
  test_files::TempDir dir{"arlo-supervisor"};
  std::string fifo = (dir.path() / "gate").string();
  Gate() { EXPECT_EQ(::mkfifo(fifo.c_str(), 0600), 0); }
  ChildSpec child(const std::string& name, int code) const {
    return {name, {"sh", "-c", fmt::format("cat '{}' >/dev/null; exit {}", fifo, code)}, {}};
  }
  void release() const {
    const int fd = ::open(fifo.c_str(), O_WRONLY);  // waits for the child to open its end
    ASSERT_GE(fd, 0);
    ::close(fd);
  }
};

// Runs the loop until `done` (the guard is against a hang, not a timing).
template <typename Done>
bool run_until(boost::asio::io_context& io, Done done) {
  const auto guard = std::chrono::steady_clock::now() + seconds(30);
  while (!done() && std::chrono::steady_clock::now() < guard) {
    io.run_one_for(milliseconds(100));
    if (io.stopped()) io.restart();
  }
  return done();
}

// A local HTTP server whose /health answers every probe with `status` and `body`.
struct HealthServer {
  http::Server server;
  std::uint16_t port = 0;
  HealthServer(boost::asio::io_context& io, int status, const char* body) : server(io, http::ServerOptions{}) {
    server.route(http::Verb::get, "/health", [status, body](http::Request) -> Awaitable<http::Response> {
      co_return http::Response::text(status, body);
    });
    auto started = server.start();
    EXPECT_TRUE(started) << started.error().what();
    port = started.value_or(0);
  }
};

std::string health_url(std::uint16_t port) { return fmt::format("http://127.0.0.1:{}", port); }

// What every test drives: a Supervisor on the fake clock and a loop, recording its events; the
// /health server, where a test has one, lives between the loop and the supervisor, as locals would.
class SupervisorTest : public ::testing::Test {
 protected:
  // Starts the /health server; false when it did not start.
  bool serve_health(int status, const char* body) {
    health.emplace(io, status, body);
    return health->port != 0;
  }

  FakeClock clock;  // outlives the loop: a probe still pending there holds a timer of it
  boost::asio::io_context io;
  std::optional<HealthServer> health;
  Recorder rec;
  Supervisor sup{io, clock, rec.listener()};
};

TEST_F(SupervisorTest, RestartsAnExitedChildAfterThePolicysBackoffThenGivesUpPastTheBound) {
  Gate gate;
  const RestartLimits limits{.max_restarts = 2,
                             .window = std::chrono::minutes(10),
                             .initial_backoff = milliseconds(500),
                             .max_backoff = seconds(10)};
  ASSERT_TRUE(sup.start(gate.child("crasher", 3), Supervision{limits, std::nullopt, {}}));
  ASSERT_EQ(rec.kinds(), std::vector<Kind>{Kind::kStarted});
  pid_t pid = rec.events.back().pid;
  ASSERT_GT(pid, 0);
  const std::vector<orch::Duration> delays = {milliseconds(500), seconds(1)};
  for (std::size_t i = 0; i < delays.size(); ++i) {
    SCOPED_TRACE(fmt::format("restart {}", i + 1));
    gate.release();
    wait_exited(pid);
    rec.events.clear();
    clock.advance(kTick);  // the poller reaps it
    ASSERT_EQ(rec.kinds(), (std::vector<Kind>{Kind::kExited, Kind::kRestarting}));
    ASSERT_TRUE(rec.events[0].exit.has_value());
    EXPECT_EQ(rec.events[0].pid, pid);
    EXPECT_TRUE(WIFEXITED(rec.events[0].exit->status));
    EXPECT_EQ(WEXITSTATUS(rec.events[0].exit->status), 3);
    EXPECT_EQ(rec.events[1].delay, delays[i]);
    EXPECT_EQ(rec.events[1].attempt, static_cast<int>(i) + 1);
    EXPECT_EQ(rec.events[1].max_restarts, 2);
    rec.events.clear();
    clock.advance(delays[i] - milliseconds(1));
    EXPECT_TRUE(rec.events.empty()) << "not restarted before its backoff";
    clock.advance(milliseconds(1));
    ASSERT_EQ(rec.kinds(), std::vector<Kind>{Kind::kStarted});
    EXPECT_TRUE(rec.events[0].restarted);
    EXPECT_NE(rec.events[0].pid, pid);
    pid = rec.events[0].pid;
  }
  gate.release();
  wait_exited(pid);
  rec.events.clear();
  clock.advance(kTick);
  ASSERT_EQ(rec.kinds(), (std::vector<Kind>{Kind::kExited, Kind::kGaveUp}));
  EXPECT_EQ(rec.events[1].gave_up, GaveUpReason::kPastTheBound);
  EXPECT_EQ(rec.events[1].max_restarts, 2);
  EXPECT_FALSE(rec.events[1].reason.empty());
  rec.events.clear();
  clock.advance(std::chrono::minutes(1));
  EXPECT_TRUE(rec.events.empty()) << "given up: never started again";
}

TEST_F(SupervisorTest, AFinalExitCodeOrAChildWithoutRestartsGivesUpAtOnce) {
  ASSERT_TRUE(sup.start({"usage", {"sh", "-c", "exit 2"}, {}}, Supervision{RestartLimits{}, std::nullopt, {2}}));
  ASSERT_TRUE(sup.start({"once", {"sh", "-c", "exit 0"}, {}}));  // no restart policy
  ASSERT_EQ(rec.kinds(), (std::vector<Kind>{Kind::kStarted, Kind::kStarted}));
  wait_exited(rec.events[0].pid);
  wait_exited(rec.events[1].pid);
  rec.events.clear();
  clock.advance(kTick);
  ASSERT_EQ(rec.events.size(), 4u);
  std::map<std::string, GaveUpReason> gave_up;
  for (const auto& e : rec.events)
    if (e.kind == Kind::kGaveUp) gave_up[e.name] = e.gave_up;
  EXPECT_EQ(gave_up["usage"], GaveUpReason::kFinalExitCode);
  EXPECT_EQ(gave_up["once"], GaveUpReason::kNotRestartable);
  rec.events.clear();
  clock.advance(seconds(30));
  EXPECT_TRUE(rec.events.empty());
}

// The ranks of one group live and die together: one exits, the other gets SIGTERM (ignored here)
// and SIGKILL after group_grace, and once both are down and the backoff passed, both start again,
// with the environment group_restart_env gives (a fresh port); one restart of the group is counted.
TEST_F(SupervisorTest, AGroupMembersExitStopsTheOthersAndRestartsTheWholeGroupWithItsNewEnvironment) {
  Gate gate;
  const auto ports = (gate.dir.path() / "ports").string();
  int restarts = 0;
  Supervision group{RestartLimits{.max_restarts = 1, .initial_backoff = milliseconds(500)}, std::nullopt, {}};
  group.group = "ranks";
  group.group_grace = seconds(5);
  group.group_restart_env = [&] { return std::map<std::string, std::string>{{"PORT", std::to_string(++restarts)}}; };
  ASSERT_TRUE(
      sup.start({"rank-0",
                 {"sh", "-c", fmt::format("echo \"${{PORT}}\" >>'{}'; cat '{}' >/dev/null; exit 3", ports, gate.fifo)},
                 {{"PORT", "0"}}},
                group));
  ASSERT_TRUE(sup.start({"rank-1", {"sh", "-c", "trap '' TERM; exec sleep 1000"}, {}}, group));
  ASSERT_EQ(rec.kinds(), (std::vector<Kind>{Kind::kStarted, Kind::kStarted}));
  EXPECT_EQ(rec.events[1].group, "ranks");
  const pid_t rank0 = rec.events[0].pid, rank1 = rec.events[1].pid;
  gate.release();
  wait_exited(rank0);
  rec.events.clear();
  clock.advance(kTick);
  ASSERT_EQ(rec.kinds(), (std::vector<Kind>{Kind::kExited, Kind::kRestarting}));
  EXPECT_EQ(rec.events[1].name, "rank-0");
  EXPECT_EQ(rec.events[1].attempt, 1);
  EXPECT_EQ(rec.events[1].reason, fmt::format("rank-0 (pid {}) exited with code 3: stopping the other members of ranks "
                                              "(rank-0, rank-1) and starting all 2 again",
                                              rank0));
  rec.events.clear();
  clock.advance(seconds(1));  // past the backoff: rank-1 ignored SIGTERM and still runs, so nobody starts
  EXPECT_TRUE(rec.events.empty());
  clock.advance(seconds(4));  // the grace: SIGKILL
  wait_exited(rank1);
  clock.advance(kTick);
  ASSERT_EQ(rec.kinds(), (std::vector<Kind>{Kind::kExited, Kind::kStarted, Kind::kStarted}));
  EXPECT_EQ(rec.events[0].name, "rank-1");
  ASSERT_TRUE(rec.events[0].exit && WIFSIGNALED(rec.events[0].exit->status));
  EXPECT_EQ(WTERMSIG(rec.events[0].exit->status), SIGKILL);
  EXPECT_EQ(to_json(rec.events[0]).at("group"), "ranks");
  EXPECT_TRUE(rec.events[1].restarted && rec.events[2].restarted);
  EXPECT_EQ(restarts, 1);
  // The restarted rank-0 started with the new PORT (it wrote it before opening the gate); its next
  // exit is past the bound (one restart): the group gives up, naming it and its status.
  const pid_t again = rec.events[1].pid, rank1_again = rec.events[2].pid;
  rec.events.clear();
  gate.release();
  std::ifstream written(ports);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(written), {}), "0\n1\n");
  wait_exited(again);
  clock.advance(kTick);
  ASSERT_EQ(rec.kinds(), (std::vector<Kind>{Kind::kExited, Kind::kGaveUp}));
  EXPECT_EQ(rec.events[1].gave_up, GaveUpReason::kPastTheBound);
  EXPECT_EQ(rec.events[1].reason.find(fmt::format("rank-0 (pid {}) exited with code 3", again)), 0u)
      << rec.events[1].reason;
  ::kill(rank1_again, SIGKILL);  // it ignores the SIGTERM of the supervisor's stop
}

TEST_F(SupervisorTest, AServerThatStopsAnsweringIsUnhealthyAfterTheConfiguredProbes) {
  ASSERT_TRUE(serve_health(200, "ok"));
  HealthCheck check;
  check.url = health_url(health->port);
  check.starting_interval = milliseconds(100);
  check.interval = seconds(1);
  check.unhealthy_after = 3;
  sup.watch("server", check);
  clock.advance(kTick);  // the first probe
  ASSERT_TRUE(run_until(io, [&] { return sup.probes("server") >= 1; }));
  ASSERT_EQ(rec.kinds(), std::vector<Kind>{Kind::kHealthy});
  EXPECT_EQ(rec.events[0].http_status, 200);
  EXPECT_TRUE(rec.events[0].first_since_start);
  EXPECT_TRUE(sup.healthy("server"));
  rec.events.clear();
  clock.advance(seconds(1));  // still answering: no event
  ASSERT_TRUE(run_until(io, [&] { return sup.probes("server") >= 2; }));
  EXPECT_TRUE(rec.events.empty());

  health->server.close();
  for (std::uint64_t failed = 1; failed <= 3; ++failed) {
    clock.advance(seconds(1));
    ASSERT_TRUE(run_until(io, [&] { return sup.probes("server") >= 2 + failed; }));
    if (failed < 3) {
      EXPECT_TRUE(rec.events.empty()) << failed << " failed probe(s): not yet unhealthy";
    }
  }
  ASSERT_EQ(rec.kinds(), std::vector<Kind>{Kind::kUnhealthy});
  EXPECT_EQ(rec.events[0].failed_probes, 3);
  EXPECT_FALSE(sup.healthy("server"));
}

// A worker restarted once the run started comes back with its restart_argv and no weights: it
// answers /health 503, which counts as healthy for it (restarted_answers_any), not at first start.
TEST_F(SupervisorTest, ARestartUsesTheRestartArgvAndThenAnyAnswerIsHealthy) {
  ASSERT_TRUE(serve_health(503, "no weights"));
  Gate gate;
  ChildSpec spec = gate.child("worker-0", 1);
  Gate restarted_gate;  // only the restart_argv opens this one
  spec.restart_argv = restarted_gate.child("worker-0", 1).argv;
  HealthCheck check;
  check.url = health_url(health->port);
  check.restarted_answers_any = true;
  ASSERT_TRUE(sup.start(spec, Supervision{RestartLimits{}, check, {}}));
  const pid_t first = rec.events.back().pid;
  clock.advance(kTick);
  ASSERT_TRUE(run_until(io, [&] { return sup.probes("worker-0") >= 1; }));
  EXPECT_FALSE(sup.healthy("worker-0")) << "503 at its first start is not healthy";
  EXPECT_EQ(rec.kinds(), std::vector<Kind>{Kind::kStarted});

  sup.use_restart_argv(true);  // the run started
  gate.release();
  wait_exited(first);
  rec.events.clear();
  clock.advance(kTick);
  ASSERT_EQ(rec.kinds(), (std::vector<Kind>{Kind::kExited, Kind::kRestarting}));
  clock.advance(rec.events[1].delay);
  ASSERT_EQ(rec.events.back().kind, Kind::kStarted);
  rec.events.clear();
  const auto probes = sup.probes("worker-0");
  clock.advance(kTick);
  ASSERT_TRUE(run_until(io, [&] { return sup.probes("worker-0") > probes; }));
  ASSERT_EQ(rec.kinds(), std::vector<Kind>{Kind::kHealthy});
  EXPECT_EQ(rec.events[0].http_status, 503);
  EXPECT_TRUE(rec.events[0].restarted);
  EXPECT_TRUE(rec.events[0].first_since_start);
  restarted_gate.release();  // returns once the restarted child opened its gate: it runs the restart_argv
}

TEST_F(SupervisorTest, WaitHealthyEndsAtTheDeadlineOnTheClockNamingWhoIsNotHealthy) {
  // Nothing listens on this port (bound and released).
  auto port = free_loopback_port();
  ASSERT_TRUE(port);
  HealthCheck check;
  check.url = health_url(*port);
  sup.watch("absent", check);
  std::optional<Status> result;
  const auto deadline = clock.now() + seconds(5);
  const std::vector<std::string> names = {"absent"};  // (GCC 12: no string-literal lists in a coroutine)
  arlo::spawn(io.get_executor(), [&]() -> Awaitable<void> { result = co_await sup.wait_healthy(names, deadline); });
  io.poll();  // waiting
  clock.advance(seconds(4));
  io.poll();
  EXPECT_FALSE(result.has_value()) << "still waiting before the deadline";
  clock.advance(seconds(1));
  ASSERT_TRUE(run_until(io, [&] { return result.has_value(); }));
  ASSERT_FALSE(*result);
  EXPECT_EQ(result->error().code(), ErrorCode::kTimeout);
  EXPECT_TRUE(rec.events.empty());
}

}  // namespace
}  // namespace arlo::session
